// A rank's part of a plan survives EncodePlanMessage / DecodePlanMessage,
// and a damaged message is an error, never a crash or a wrong plan.
#include "engine/save/plan_wire.h"

#include <gtest/gtest.h>

#include "layout/plan_part.h"
#include "testing/layout/simulated_layouts.h"

namespace shardsafe {
namespace {

SavePlan SomePart() {
  auto plan = simulated::SmallPlan();
  EXPECT_TRUE(plan.ok());
  return PartOfPlan(*plan, 3, PlanTotals(*plan));
}

TEST(PlanWireTest, APartRoundTrips) {
  const SavePlan part = SomePart();
  ASSERT_FALSE(part.files.empty());
  ASSERT_FALSE(part.copies.empty());
  auto got = DecodePlanMessage(EncodePlanMessage(part, Digest{7, 9}));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->digest, (Digest{7, 9}));
  const SavePlan& p = got->plan;
  ASSERT_EQ(p.tensors.size(), part.tensors.size());
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    EXPECT_EQ(p.tensors[t].key, part.tensors[t].key);
    EXPECT_EQ(p.tensors[t].dtype, part.tensors[t].dtype);
    EXPECT_EQ(p.tensors[t].shape, part.tensors[t].shape);
    EXPECT_EQ(p.tensors[t].chunks, part.tensors[t].chunks);
  }
  ASSERT_EQ(p.chunks.size(), part.chunks.size());
  for (size_t c = 0; c < p.chunks.size(); ++c) {
    EXPECT_EQ(p.chunks[c].tensor, part.chunks[c].tensor);
    EXPECT_EQ(p.chunks[c].bytes, part.chunks[c].bytes);
    EXPECT_EQ(p.chunks[c].slice, part.chunks[c].slice);
    EXPECT_EQ(p.chunks[c].shard_offset, part.chunks[c].shard_offset);
    EXPECT_EQ(p.chunks[c].writer, part.chunks[c].writer);
    EXPECT_EQ(p.chunks[c].writer_shard, part.chunks[c].writer_shard);
    EXPECT_EQ(p.chunks[c].holders, part.chunks[c].holders);
  }
  ASSERT_EQ(p.files.size(), part.files.size());
  EXPECT_EQ(p.files[0].chunks, part.files[0].chunks);
  EXPECT_EQ(p.files[0].payload_bytes, part.files[0].payload_bytes);
  ASSERT_EQ(p.copies.size(), part.copies.size());
  for (size_t i = 0; i < p.copies.size(); ++i) {
    EXPECT_EQ(p.copies[i].chunk, part.copies[i].chunk);
    EXPECT_EQ(p.copies[i].chunks, part.copies[i].chunks);
    EXPECT_EQ(p.copies[i].shard, part.copies[i].shard);
    EXPECT_EQ(p.part->copy_shapes[i].bytes, part.part->copy_shapes[i].bytes);
    EXPECT_EQ(p.part->copy_shapes[i].piece_bytes, part.part->copy_shapes[i].piece_bytes);
  }
  EXPECT_EQ(p.blobs.size(), part.blobs.size());
  EXPECT_EQ(p.part->rank_bytes, part.part->rank_bytes);
  EXPECT_EQ(p.part->max_rank_bytes, part.part->max_rank_bytes);
  EXPECT_EQ(p.part->files, part.part->files);
  EXPECT_EQ(p.part->chunks, part.part->chunks);
  EXPECT_EQ(p.part->held_bytes, part.part->held_bytes);
}

TEST(PlanWireTest, ACopyWhosePiecesDoNotAddUpIsAnError) {
  SavePlan part = SomePart();
  ASSERT_FALSE(part.copies.empty());
  part.copies[0].chunks = 3;
  part.part->copy_shapes[0] = {100, 40};  // 40 + 40 + 20: fine
  EXPECT_TRUE(DecodePlanMessage(EncodePlanMessage(part, Digest{})).ok());
  for (CopyShape bad : {CopyShape{100, 30}, CopyShape{80, 40}, CopyShape{100, 0}}) {
    part.part->copy_shapes[0] = bad;
    EXPECT_EQ(DecodePlanMessage(EncodePlanMessage(part, Digest{})).status().code(),
              StatusCode::kInternal)
        << bad.bytes << " in pieces of " << bad.piece_bytes;
  }
}

TEST(PlanWireTest, ATruncatedOrLengthenedMessageIsAnError) {
  const std::string msg = EncodePlanMessage(SomePart(), Digest{1, 2});
  for (size_t n : {size_t{0}, size_t{8}, msg.size() / 2, msg.size() - 1}) {
    EXPECT_EQ(DecodePlanMessage(msg.substr(0, n)).status().code(), StatusCode::kInternal) << n;
  }
  EXPECT_EQ(DecodePlanMessage(msg + "x").status().code(), StatusCode::kInternal);
}

}  // namespace
}  // namespace shardsafe
