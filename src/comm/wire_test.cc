// The wire encoding: varints of every size round-trip in as many bytes as
// their significant bits need, fixed-width values in 4 or 8, and a
// truncated or malformed number is an error, never a crash or a wrong value.
#include "comm/wire.h"

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardsafe::wire {
namespace {

TEST(WireTest, NumbersRoundTripInAsFewBytesAsTheyNeed) {
  const std::vector<uint64_t> values = {0,          1,          127,        128,
                                        16383,      16384,      UINT32_MAX, uint64_t{1} << 62,
                                        UINT64_MAX, 0x1234567};
  for (uint64_t v : values) {
    Writer w;
    w.U64(v);
    const std::string bytes = w.Take();
    int bits = 1;
    while (bits < 64 && (v >> bits) != 0) ++bits;
    EXPECT_EQ(bytes.size(), static_cast<size_t>((bits + 6) / 7)) << v;
    Reader r(bytes);
    auto got = r.U64();
    ASSERT_TRUE(got.ok()) << v;
    EXPECT_EQ(*got, v);
    EXPECT_TRUE(r.done());
  }
  Writer w;
  w.Fixed32(0xdeadbeef);
  w.Fixed64(1);
  w.U32(300);
  w.Slice(Slice{Box{{4096, 0}, {4096, 8192}}, FlatRange{5, 70000}});
  const std::string bytes = w.Take();
  EXPECT_EQ(bytes.size(), 4u + 8u + 2u + (1 + 2 + 1) + (1 + 2 + 2) + 1 + (1 + 3));
  Reader r(bytes);
  EXPECT_EQ(*r.Fixed32(), 0xdeadbeefu);
  EXPECT_EQ(*r.Fixed64(), 1u);
  EXPECT_EQ(*r.U32(), 300u);
  auto slice = r.Slice();
  ASSERT_TRUE(slice.ok());
  EXPECT_EQ(slice->box.offset, (Shape{4096, 0}));
  EXPECT_EQ(slice->box.size, (Shape{4096, 8192}));
  ASSERT_TRUE(slice->flat.has_value());
  EXPECT_EQ(slice->flat->end, 70000u);
  EXPECT_TRUE(r.done());
}

TEST(WireTest, TruncatedOrMalformedNumbersAreErrors) {
  const std::vector<std::string> bad = {
      std::string(),                                    // nothing
      std::string("\x80", 1),                           // a continuation, then the end
      std::string(10, '\xff'),                          // more than 64 bits
      std::string(9, '\x80') + std::string("\x02", 1),  // bit 64 set in the tenth byte
      std::string(11, '\x80'),                          // too long
  };
  for (const std::string& bytes : bad) {
    Reader r(bytes);
    EXPECT_EQ(r.U64().status().code(), StatusCode::kInternal) << bytes.size();
  }
  // A Reader views its bytes: each message outlives its reader.
  Writer w;
  w.U64(uint64_t{1} << 32);
  const std::string wide = w.Take();
  Reader r(wide);
  EXPECT_EQ(r.U32().status().code(), StatusCode::kInternal) << "a U32 above 32 bits";
  const std::string three(3, '\0');
  Reader fixed(three);
  EXPECT_EQ(fixed.Fixed32().status().code(), StatusCode::kInternal);
  Writer shape;
  shape.U32(1000000);  // a shape of a million dimensions, none sent
  const std::string dims_only = shape.Take();
  Reader dims(dims_only);
  EXPECT_EQ(dims.Shape().status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace shardsafe::wire
