// libFuzzer target: the safetensors header parser must either accept an input
// or throw deepinfer::Error — never crash, hang or read out of bounds. Accepted
// headers must describe tensors that lie inside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/error.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const deepinfer::SafetensorsHeader header =
        deepinfer::parse_safetensors_header(data, size, "fuzz.safetensors");
    for (const auto& t : header.tensors) {
      // The parser promised these bounds; touch the first and last byte to let ASan check.
      if (t.num_bytes() == 0) continue;
      if (header.data_offset + t.data_end > size) std::abort();
      volatile uint8_t first = data[header.data_offset + t.data_begin];
      volatile uint8_t last = data[header.data_offset + t.data_end - 1];
      (void)first;
      (void)last;
    }
  } catch (const deepinfer::Error&) {
  }
  return 0;
}
