// The server's own OpenAPI 3.0 description (GET /openapi.json), what schemathesis tests against.
#pragma once
#include <string>

namespace deepinfer::server {
const std::string& openapi_json();
}  // namespace deepinfer::server
