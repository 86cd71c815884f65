// The server's own OpenAPI 3.0 description (GET /openapi.json), what schemathesis tests against.
#pragma once
#include <string>

namespace deepinfer::server {
// `model_name`: the only value the model fields accept (so generated requests reach the engine).
std::string openapi_json(const std::string& model_name);
}  // namespace deepinfer::server
