data.rows=data.table.map(function(v){var o={};data.columns.forEach(function(c,i){
  o[c]=(typeof v[i]==="string"&&v[i].charAt(0)==="@")?data.texts[+v[i].slice(1)]:v[i]});return o});
var st=document.createElement("style");st.textContent=data.css;root.appendChild(st);
root.classList.add("tbw-tiles");
var state={};
function knobs(onchange){knobRows(body,data.knobs,state,onchange)}
function find(names){return data.rows.find(function(r){return names.every(function(n){
  return String(r[n])===String(state[n])})})}
function fmt(v){return Number(v).toLocaleString("en-US")}
