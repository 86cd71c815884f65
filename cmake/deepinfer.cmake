# Shared compile settings for every deepinfer target. Every build type targets x86-64-v3 (AVX2,
# FMA, F16C), the ISA the optimized build always required: a Debug / sanitizer build without it
# ran the CPU kernels' fused steps as one libm fmaf call per lane (the embedded model's prefill
# ~1,800x slower than Release under ASan; CI's ASan stage timed out three tests, 2026-12-04).
add_library(deepinfer_flags INTERFACE)
target_compile_options(deepinfer_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter -Wno-psabi>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Release,RelWithDebInfo>>:-O3 -march=x86-64-v3>
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<NOT:$<CONFIG:Release,RelWithDebInfo>>>:-march=x86-64-v3>)
if(DEEPINFER_WERROR)
  target_compile_options(deepinfer_flags INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()
if(DEEPINFER_SANITIZE)
  # A Debug sanitizer build is optimized at -O1 (AddressSanitizer's own advice): at -O0 the
  # model-running tests ran 17-39x slower than Release (server_pytest 567 s, e2e_eval 414 s in
  # CI's ASan stage, 2026-12-03) and made it the longest stage. GCC 12's -Wmaybe-uninitialized
  # misfires on libstdc++'s std::function inside std::regex at -O1 with ASan; the -Werror
  # Release build keeps the warning.
  target_compile_options(deepinfer_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Debug>>:-O1 -Wno-maybe-uninitialized>)
  target_link_options(deepinfer_flags INTERFACE -fsanitize=address,undefined)
endif()
target_include_directories(deepinfer_flags INTERFACE ${CMAKE_SOURCE_DIR} ${CMAKE_SOURCE_DIR}/include)

# deepinfer_module(NAME SOURCES ... DEPS ...): one static library per module.
function(deepinfer_module name)
  cmake_parse_arguments(M "" "" "SOURCES;DEPS" ${ARGN})
  add_library(deepinfer_${name} STATIC ${M_SOURCES})
  target_link_libraries(deepinfer_${name} PUBLIC deepinfer_flags ${M_DEPS})
endfunction()

# deepinfer_test(NAME SOURCES ... DEPS ...): one GoogleTest binary, registered with CTest.
function(deepinfer_test name)
  cmake_parse_arguments(T "" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  target_link_libraries(${name} PRIVATE deepinfer_flags ${T_DEPS} GTest::gtest_main)
  target_compile_definitions(${name} PRIVATE
    DEEPINFER_SOURCE_DIR="${CMAKE_SOURCE_DIR}" DEEPINFER_SHARED_DIR="${CMAKE_SOURCE_DIR}/../shared")
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES LABELS "${T_LABELS}")
endfunction()
