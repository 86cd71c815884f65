// parse_model_config / load_model_config: config.json -> the registered
// architecture's reader (model/registry.h), chosen by model_type.
#include "model/config.h"

#include <nlohmann/json.hpp>
#include <sys/stat.h>

#include "core/error.h"
#include "core/json.h"
#include "core/mapped_file.h"
#include "model/registry.h"

namespace deepinfer {

ModelConfig parse_model_config(std::string_view json_text, const std::string& source) {
  const nlohmann::json root = parse_json(json_text, source);
  DI_CHECK(root.is_object(), source, ": expected a JSON object");
  auto it = root.find("model_type");
  DI_CHECK(it != root.end() && it->is_string(), source, ": field 'model_type': expected a string",
           it == root.end() ? std::string(", but it is missing") : ", got " + json_snippet(*it),
           " (known: ", known_model_types(), ")");
  return find_architecture(it->get<std::string>(), source).parse_config(root, source);
}

ModelConfig load_model_config(const std::string& path) {
  struct stat st {};
  std::string file = path;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    file = path + (path.empty() || path.back() == '/' ? "" : "/") + "config.json";
  }
  return parse_model_config(read_text_file(file), file);
}

}  // namespace deepinfer
