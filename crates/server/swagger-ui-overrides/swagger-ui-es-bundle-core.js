// Not shipped with Spindle: /docs loads swagger-ui-bundle.js.
