var body=root.querySelector(".tbw-body");body.innerHTML="";
function el(tag,cls,text){var e=document.createElement(tag);if(cls)e.className=cls;
  if(text!==undefined)e.textContent=text;return e}
function knobRows(parent,knobs,state,onchange){var setters={};
knobs.forEach(function(k,ki){
  var row=el("div","tbw-knob");var lab=el("span","tbw-label",k.label);lab.id=root.id+"-k"+ki;
  row.appendChild(lab);var idx=Math.max(0,k.values.indexOf(k.initial));state[k.name]=k.values[idx];
  if(k.kind==="slider"){
    var inp=el("input");inp.type="range";inp.min=0;inp.max=k.values.length-1;inp.step=1;
    inp.value=idx;inp.setAttribute("aria-labelledby",lab.id);inp.dataset.knob=k.name;
    var out=el("output","",String(k.values[idx]));
    inp.addEventListener("input",function(){state[k.name]=k.values[+inp.value];
      out.textContent=String(state[k.name]);onchange()});
    row.appendChild(inp);row.appendChild(out);
    setters[k.name]=function(v){inp.value=k.values.indexOf(v);inp.dispatchEvent(new Event("input"))};
  }else{
    var group=el("div","tbw-choices");group.setAttribute("role","radiogroup");
    group.setAttribute("aria-labelledby",lab.id);group.dataset.knob=k.name;var radios=[];
    k.values.forEach(function(v,vi){var l=el("label","tbw-choice");var r=el("input");
      r.type="radio";r.name=root.id+"-"+ki;r.value=String(vi);r.checked=vi===idx;
      r.addEventListener("change",function(){if(r.checked){state[k.name]=v;onchange()}});
      l.appendChild(r);l.appendChild(document.createTextNode(" "+String(v)));
      group.appendChild(l);radios.push(r)});
    row.appendChild(group);
    setters[k.name]=function(v){var i=k.values.indexOf(v);radios[i].checked=true;
      radios[i].dispatchEvent(new Event("change"))};
  }
  parent.appendChild(row)});
return setters}
