// Refreshes the charts of the page every 30 seconds by reading the page
// again; without JavaScript, reloading the page does the same.
(function () {
  "use strict";
  var charts = document.querySelectorAll("[data-refresh]");
  if (charts.length === 0 || !window.fetch || !window.DOMParser) {
    return;
  }
  function refresh() {
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html === null) {
          return;
        }
        var doc = new DOMParser().parseFromString(html, "text/html");
        document.querySelectorAll("[data-refresh]").forEach(function (el) {
          var fresh = doc.querySelector('[data-refresh="' + CSS.escape(el.getAttribute("data-refresh")) + '"]');
          if (fresh) {
            el.replaceWith(document.importNode(fresh, true));
          }
        });
      })
      .catch(function () { /* the next tick tries again */ });
  }
  window.setInterval(refresh, 30000);
})();
