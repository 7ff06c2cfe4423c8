// Byte-level JSON text helpers shared by the safetensors reader and writer
// (internal to format/).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace shardsafe::internal {

// Checks that `bytes` is well-formed UTF-8 as Rust's std::str::from_utf8
// defines it (no overlong forms, no surrogates, nothing above U+10FFFF).
// Returns nullopt if valid, else Rust's Utf8Error text, e.g. "invalid utf-8
// sequence of 1 bytes from index 5" or "incomplete utf-8 byte sequence from
// index 9".
std::optional<std::string> CheckUtf8(std::string_view bytes);

// `s` as a quoted JSON string, escaped the way serde_json writes it: raw
// UTF-8, `"` and `\` escaped, \b \t \n \f \r for those controls, \u00xx
// (lowercase hex) for the other control characters below 0x20.
std::string JsonQuote(std::string_view s);

}  // namespace shardsafe::internal
