// Placeholder of the workbench page until the page's npm build (ui/) replaces ui/dist: it asks the
// API for the session and the examples and shows them, so the daemon side can be tried by hand.
"use strict";
(async function () {
  const status = document.getElementById("status");
  const headers = {};
  const token = sessionStorage.getItem("cloakd-token");
  if (token) headers["Authorization"] = "Bearer " + token;
  const session = await fetch("/api/v1/session", { headers });
  if (session.status === 401) {
    status.textContent = "This daemon requires a bearer token (auth.required).";
    return;
  }
  const s = await session.json();
  const examples = await (await fetch("/api/v1/examples", { headers })).json();
  status.textContent =
    "Signed in as " + (s.principal || "anonymous") + "; examples: " +
    examples.map(function (e) { return e.name + " (" + e.rows + " rows)"; }).join(", ");
})();
