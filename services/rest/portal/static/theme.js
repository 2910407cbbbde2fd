// Before the first paint (a classic, blocking script): the theme chosen last time,
// else the system's, so the page does not flash the other one.
(function () {
  var saved = localStorage.getItem("pai.theme");
  var dark = saved ? saved === "dark" : window.matchMedia("(prefers-color-scheme: dark)").matches;
  document.documentElement.dataset.theme = dark ? "dark" : "light";
})();
