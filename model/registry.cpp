#include "model/registry.h"

#include "core/error.h"
#include "model/deepseek_v3/arch.h"
#include "model/deepseek_v32/arch.h"
#include "model/deepseek_v4/arch.h"
#include "model/deepseek_v41/arch.h"

namespace deepinfer {

const std::vector<Architecture>& architectures() {
  // One line per architecture.
  static const std::vector<Architecture> list = {
      deepseek_v3_architecture(),
      deepseek_v2_architecture(),
      deepseek_v32_architecture(),
      deepseek_v4_architecture(),
      deepseek_v41_architecture(),
      deepseek_v41_text_architecture(),
  };
  return list;
}

std::string known_model_types() {
  std::string out;
  for (const Architecture& a : architectures()) {
    out += (out.empty() ? "'" : ", '") + a.model_type + "'";
  }
  return out;
}

const Architecture& find_architecture(const std::string& model_type, const std::string& source) {
  for (const Architecture& a : architectures()) {
    if (a.model_type == model_type) return a;
  }
  fail(source, ": field 'model_type': '", model_type, "' is not supported (known: ",
       known_model_types(), ")");
}

}  // namespace deepinfer
