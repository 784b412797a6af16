// The only file that includes nanobind: converts Python arguments to pointers and back.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

NB_MODULE(_native, m) {
  m.doc() = "Tessera CPU kernels";
  m.attr("LAYOUT_VERSION") = 0;
}
