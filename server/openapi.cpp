#include "server/openapi.h"

#include <nlohmann/json.hpp>

namespace deepinfer::server {

std::string openapi_json(const std::string& model_name) {
  static const std::string doc = R"JSON({
  "openapi": "3.0.3",
  "info": {"title": "deepinfer serve", "version": "0.1.0",
           "description": "OpenAI-compatible endpoints (vLLM's fields)."},
  "paths": {
    "/health": {"get": {"responses": {"200": {"description": "ready"}, "503": {"description": "loading or draining"}}}},
    "/version": {"get": {"responses": {"200": {"description": "version", "content": {"application/json": {"schema": {
      "type": "object", "required": ["version"], "properties": {"version": {"type": "string"}}}}}}}}},
    "/metrics": {"get": {"responses": {"200": {"description": "Prometheus text format"}}}},
    "/v1/models": {"get": {"responses": {"200": {"description": "served models", "content": {"application/json": {
      "schema": {"$ref": "#/components/schemas/ModelList"}}}}}}},
    "/v1/completions": {"post": {
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/CompletionRequest"}}}},
      "responses": {"200": {"description": "a completion (or an SSE stream when stream is true)"},
                    "400": {"$ref": "#/components/responses/Error"}, "404": {"$ref": "#/components/responses/Error"},
                    "413": {"$ref": "#/components/responses/Error"}, "503": {"$ref": "#/components/responses/Error"}}}},
    "/v1/chat/completions": {"post": {
      "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ChatCompletionRequest"}}}},
      "responses": {"200": {"description": "a chat completion (or an SSE stream when stream is true)"},
                    "400": {"$ref": "#/components/responses/Error"}, "404": {"$ref": "#/components/responses/Error"},
                    "413": {"$ref": "#/components/responses/Error"}, "503": {"$ref": "#/components/responses/Error"}}}},
    "/tokenize": {"post": {
      "requestBody": {"required": true, "content": {"application/json": {"schema": {
        "type": "object", "properties": {"model": {"type": "string"}, "prompt": {"type": "string"},
        "messages": {"type": "array", "items": {"$ref": "#/components/schemas/Message"}}}}}}},
      "responses": {"200": {"description": "token ids", "content": {"application/json": {"schema": {
        "type": "object", "required": ["count", "tokens", "max_model_len"], "properties": {
          "count": {"type": "integer"}, "max_model_len": {"type": "integer"},
          "tokens": {"type": "array", "items": {"type": "integer"}}}}}}},
        "400": {"$ref": "#/components/responses/Error"}, "404": {"$ref": "#/components/responses/Error"}}}},
    "/detokenize": {"post": {
      "requestBody": {"required": true, "content": {"application/json": {"schema": {
        "type": "object", "required": ["tokens"], "properties": {"model": {"type": "string"},
        "tokens": {"type": "array", "items": {"type": "integer"}}}}}}},
      "responses": {"200": {"description": "text", "content": {"application/json": {"schema": {
        "type": "object", "required": ["prompt"], "properties": {"prompt": {"type": "string"}}}}}},
        "400": {"$ref": "#/components/responses/Error"}, "404": {"$ref": "#/components/responses/Error"}}}}
  },
  "components": {
    "responses": {"Error": {"description": "an OpenAI-shaped error", "content": {"application/json": {"schema": {
      "$ref": "#/components/schemas/ErrorResponse"}}}}},
    "schemas": {
      "ErrorResponse": {"type": "object", "required": ["error"], "properties": {"error": {"type": "object",
        "required": ["message", "type", "code"], "properties": {"message": {"type": "string"}, "type": {"type": "string"},
        "param": {"type": "string", "nullable": true}, "code": {"type": "integer"}}}}},
      "ModelList": {"type": "object", "required": ["object", "data"], "properties": {"object": {"type": "string"},
        "data": {"type": "array", "items": {"type": "object", "required": ["id", "object"], "properties": {
          "id": {"type": "string"}, "object": {"type": "string"}, "owned_by": {"type": "string"}}}}}},
      "Message": {"type": "object", "required": ["role"], "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"type": "string", "nullable": true}}},
      "Sampling": {"type": "object", "properties": {
        "model": {"type": "string"},
        "max_tokens": {"type": "integer", "minimum": 1, "maximum": 64},
        "n": {"type": "integer", "minimum": 1, "maximum": 4},
        "stream": {"type": "boolean"},
        "stop": {"oneOf": [{"type": "string", "minLength": 1}, {"type": "array", "items": {"type": "string", "minLength": 1}}]},
        "seed": {"type": "integer"},
        "temperature": {"type": "number", "minimum": 0, "maximum": 2},
        "top_p": {"type": "number", "exclusiveMinimum": true, "minimum": 0, "maximum": 1},
        "top_k": {"type": "integer", "minimum": -1},
        "min_p": {"type": "number", "minimum": 0, "maximum": 1},
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
        "repetition_penalty": {"type": "number", "exclusiveMinimum": true, "minimum": 0, "maximum": 10},
        "user": {"type": "string"}}},
      "CompletionRequest": {"allOf": [{"$ref": "#/components/schemas/Sampling"}, {"type": "object", "required": ["prompt"],
        "properties": {
          "prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}, "minItems": 1},
                               {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}]},
          "echo": {"type": "boolean"},
          "logprobs": {"type": "integer", "minimum": 0, "maximum": 20}}}]},
      "ChatCompletionRequest": {"allOf": [{"$ref": "#/components/schemas/Sampling"}, {"type": "object", "required": ["messages"],
        "properties": {
          "messages": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Message"}},
          "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": 64},
          "logprobs": {"type": "boolean"},
          "top_logprobs": {"type": "integer", "minimum": 0, "maximum": 20},
          "response_format": {"type": "object", "required": ["type"], "properties": {
            "type": {"type": "string", "enum": ["text", "json_object", "json_schema"]},
            "json_schema": {"type": "object", "properties": {"name": {"type": "string"}, "schema": {"type": "object"}}}}}}}]}
    }
  }
})JSON";
  // Every "model": {"type": "string"} becomes an enum of the served name.
  const std::string from = R"("model": {"type": "string"})";
  const std::string to = R"("model": {"type": "string", "enum": [)" + nlohmann::json(model_name).dump() + "]}";
  std::string out = doc;
  for (size_t pos = out.find(from); pos != std::string::npos; pos = out.find(from, pos + to.size()))
    out.replace(pos, from.size(), to);
  return out;
}

}  // namespace deepinfer::server
