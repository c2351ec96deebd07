// Private to the values of the Jinja renderer (jinja_value.cpp,
// jinja_value_format.cpp): the budget of the render running on this
// thread as both use it, and the depth bound of the walkers of nested
// values.
#pragma once

#include "chat/jinja_value.h"

#include <string>

namespace nf::jinja {

/// This thread's budget (currentBudget()); nullptr outside a render.
extern thread_local constinit Budget *tBudget;

/// The levels of ValueDepth open on this thread.
extern thread_local constinit int tValueDepth;

// The walkers of nested values (repr, tojson, ==, <) stop at
// kMaxValueDepth levels instead of overflowing the stack.
class ValueDepth {
public:
  explicit ValueDepth(const char *what) {
    if (++tValueDepth > kMaxValueDepth) {
      --tValueDepth;
      throw Error(std::string(what) +
                  ": the value is nested too deeply (more than " +
                  std::to_string(kMaxValueDepth) + " levels)");
    }
  }
  ~ValueDepth() { --tValueDepth; }
  ValueDepth(const ValueDepth &) = delete;
  ValueDepth &operator=(const ValueDepth &) = delete;
};

} // namespace nf::jinja
