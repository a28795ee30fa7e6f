// /docs: the API's description in Swagger UI (vendored under vendor/swagger-ui/, see its README).
// A file of this origin rather than an inline script, so the page keeps the dashboard's
// Content-Security-Policy (script-src 'self'). Nothing is fetched from anywhere else: the document
// is /openapi.json, and the online validator (validator.swagger.io) is off.
"use strict";

window.ui = SwaggerUIBundle({
  url: "/openapi.json",
  dom_id: "#swagger-ui",
  layout: "BaseLayout",
  deepLinking: true,
  showExtensions: true,
  showCommonExtensions: true,
  validatorUrl: null,
  presets: [SwaggerUIBundle.presets.apis],
});
