// dtype conversion on load (docs/format.md §5): among BOOL, the integer
// types and F16/BF16/F32/F64.
//
// Rounding: every conversion rounds once, to nearest with ties to even,
// even when it goes through a wider type (round-to-odd intermediates make
// the two-step paths exact). Float -> int truncates toward zero and
// saturates, NaN -> 0; int -> int saturates; anything -> BOOL is x != 0.
// Pure; thread-safe.
#pragma once

#include <cstdint>

#include "shardsafe/source.h"  // CanConvert: which conversions exist
#include "shardsafe/types.h"

namespace shardsafe {

// Converts `n` elements. `src` and `dst` need no alignment and must not
// overlap. Requires CanConvert(from, to).
void ConvertElements(const void* src, DType from, void* dst, DType to, uint64_t n);

}  // namespace shardsafe
