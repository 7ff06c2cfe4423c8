#include "storage/aligned_buffer.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

namespace shardsafe {
namespace {

TEST(AlignedBufferTest, IsAlignedPreFaultedAndOfTheAlignedSize) {
  AlignedBuffer b = AcquireAlignedBuffer(10000);
  ASSERT_FALSE(b.empty());
  EXPECT_EQ(b.capacity(), AlignUp(10000));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kDirectIoAlignment, 0u);
  std::memset(b.data(), 0x5a, b.capacity());  // all of it is usable
}

TEST(AlignedBufferTest, FileBuffersAreRecycledThroughTheCache) {
  const size_t size = size_t{16} << 20;
  const size_t before = AlignedBufferCacheBytes();  // other tests of this process may leave some
  char* first = nullptr;
  {
    AlignedBuffer b = AcquireAlignedBuffer(size);
    first = b.data();
  }
  EXPECT_EQ(AlignedBufferCacheBytes(), before + size);
  AlignedBuffer again = AcquireAlignedBuffer(size);
  EXPECT_EQ(again.data(), first);
  EXPECT_EQ(AlignedBufferCacheBytes(), before);
}

TEST(AlignedBufferTest, AStagingArenaIsFreedNotCached) {
  // Kept, a released arena would hold memory its owner gave back.
  const size_t before = AlignedBufferCacheBytes();
  { AlignedBuffer arena = AcquireAlignedBuffer(size_t{80} << 20); }
  EXPECT_EQ(AlignedBufferCacheBytes(), before);
}

}  // namespace
}  // namespace shardsafe
