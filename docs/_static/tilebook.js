// The theme's sidebar toggles (<summary> with only an icon) get a name a screen
// reader can say: "Show or hide <section>".
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("details > summary").forEach(function (s) {
    if (s.textContent.trim() || s.getAttribute("aria-label")) return;
    var item = s.closest("li");
    var link = item ? item.querySelector("a") : null;
    var name = link ? link.textContent.trim() : "this section";
    s.setAttribute("aria-label", "Show or hide " + name);
  });
});
