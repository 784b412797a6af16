// A thread_local scratch object seen by a kernel through a plain pointer.
//
// This module is loaded by dlopen, so every access to a thread_local is a call to __tls_get_addr. GCC treats the
// thread_local's address as a constant: it propagates it into the helpers a kernel calls (cloning them, ".constprop")
// and calls __tls_get_addr again at each use, inside their loops. The call clobbers every vector register (none is
// callee-saved in the x86-64 ABI), so the loop spills its accumulators around it and runs vzeroupper: measured on the
// q8_0 decode attention (Zen 4), a call per row and block of its softmax. `opaque_ref` hides where the reference
// comes from (an empty asm the compiler must assume changes the pointer): the address is taken once, and the helpers
// get an ordinary pointer in a register.
#pragma once

namespace tessera {

template <class T>
[[gnu::always_inline]] inline T& opaque_ref(T& x) {
  T* p = &x;
  asm("" : "+r"(p));
  return *p;
}

}  // namespace tessera
