// Tests of the engine side of an opened source: the message that carries it
// from rank 0 to the others (EncodeSource / DecodeSource), moving its
// tensors between the index and the packed form (Repack), and the data
// files a load opens (FileSources).
#include "engine/load/source.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "format/index_packed.h"
#include "shardsafe/checkpoint.h"
#include "shardsafe/comm.h"
#include "testing/status_matchers.h"
#include "testing/test_util.h"

namespace shardsafe {
namespace {

// A tensor's dtype and shape as "KEY DTYPE SHAPE", to compare sources by.
std::vector<std::string> Described(const CheckpointSource& src) {
  std::vector<std::string> out;
  if (src.packed) {
    for (size_t t = 0; t < src.packed->size(); ++t) {
      out.push_back(std::string(src.packed->key(t)) + " " +
                    std::string(DTypeName(src.packed->dtype(t))) + " " +
                    ShapeToString(src.packed->shape(t)));
    }
  } else {
    for (const auto& [key, t] : src.index.tensors) {
      out.push_back(key + " " + std::string(DTypeName(t.dtype)) + " " + ShapeToString(t.shape));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

class SourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("source");
    path_ = dir_ + "/step-3";
    // Two ranks' shards of "w", and "b" whole from rank 0.
    RunRanks(2, [&](int r, Comm& comm) {
      std::vector<OwnedShard> shards = {
          MakeShard("w", DType::kF32, {4, 6}, {Box{{2u * r, 0}, {2, 6}}, std::nullopt})};
      if (r == 0) {
        shards.push_back(MakeShard("b", DType::kBF16, {6}, {Box::Whole({6}), std::nullopt}));
      }
      SaveState state;
      for (const OwnedShard& s : shards) state.tensors.push_back(s.View());
      state.values = R"({"step": 3})";
      auto saved = Save(state, path_, comm, {});
      EXPECT_TRUE(saved.ok()) << saved.status().ToString();
    });
  }
  void TearDown() override { DefaultFileSystem()->RemoveAll(dir_).IgnoreError(); }

  std::string dir_, path_;
  FileSystem& fs_ = *DefaultFileSystem();
};

TEST_F(SourceTest, ASourceCrossesToOtherRanksWithTheIndexRankZeroRead) {
  std::string text;
  auto opened = OpenSource(fs_, path_, OpenHow{.text = &text});
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  ASSERT_FALSE(text.empty());
  auto decoded = DecodeSource(EncodeSource(*opened, text));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->path, opened->path);
  EXPECT_EQ(decoded->data_dir, opened->data_dir);
  EXPECT_TRUE(decoded->native);
  EXPECT_EQ(decoded->index.tag, "step-3");
  EXPECT_EQ(decoded->index.values, opened->index.values);
  EXPECT_EQ(decoded->index.files.size(), opened->index.files.size());
  ASSERT_NE(decoded->packed, nullptr) << "the receiver's tensors are packed";
  EXPECT_EQ(Described(*decoded), (std::vector<std::string>{"b BF16 [6]", "w F32 [4, 6]"}));
  EXPECT_EQ(decoded->pin, nullptr) << "only the rank that opened it pins the index";
}

TEST_F(SourceTest, WithoutTheIndexTextTheSourceIsSentAsItsIndexSerialized) {
  auto opened = OpenSource(fs_, path_, OpenHow{});
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  for (bool packed : {true, false}) {
    Repack(&*opened, packed);
    auto decoded = DecodeSource(EncodeSource(*opened, ""));
    ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
    EXPECT_EQ(Described(*decoded), Described(*opened)) << "packed " << packed;
    EXPECT_EQ(decoded->index.values, opened->index.values);
  }
}

TEST_F(SourceTest, AMessageCutShortIsAnError) {
  std::string text;
  auto opened = OpenSource(fs_, path_, OpenHow{.text = &text});
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const std::string msg = EncodeSource(*opened, text);
  for (size_t keep : {size_t{0}, size_t{3}, msg.size() / 2, msg.size() - 1}) {
    EXPECT_TRUE(IsError(DecodeSource(std::string_view(msg).substr(0, keep)),
                        StatusCode::kInternal, "message between ranks"))
        << "cut at " << keep;
  }
}

TEST_F(SourceTest, RepackMovesTheTensorsAndKeepsThem) {
  auto opened = OpenSource(fs_, path_, OpenHow{.packed = false});
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  ASSERT_EQ(opened->packed, nullptr);
  const std::vector<std::string> tensors = Described(*opened);
  ASSERT_EQ(tensors.size(), 2u);
  Repack(&*opened, true);
  ASSERT_NE(opened->packed, nullptr);
  EXPECT_TRUE(opened->index.tensors.empty());
  EXPECT_EQ(Described(*opened), tensors);
  const PackedTensors* packed = opened->packed.get();
  Repack(&*opened, true);  // already packed: left as it is
  EXPECT_EQ(opened->packed.get(), packed);
  Repack(&*opened, false);
  EXPECT_EQ(opened->packed, nullptr);
  EXPECT_EQ(Described(*opened), tensors);
}

TEST_F(SourceTest, FileSourcesNameEachDataFileWithTheSizeTheIndexRecords) {
  auto opened = OpenSource(fs_, path_, OpenHow{});
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  const LoadSources sources = FileSources(*opened);
  ASSERT_EQ(sources.file_paths.size(), opened->index.files.size());
  ASSERT_EQ(sources.file_bytes.size(), opened->index.files.size());
  EXPECT_EQ(sources.within, path_);
  for (size_t f = 0; f < sources.file_paths.size(); ++f) {
    EXPECT_EQ(sources.file_paths[f], path_ + "/" + opened->index.files[f].name);
    auto info = fs_.Stat(sources.file_paths[f]);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    EXPECT_EQ(sources.file_bytes[f], info->size) << sources.file_paths[f];
  }
  opened->native = false;  // a foreign source: no sizes to hold its files to
  EXPECT_TRUE(FileSources(*opened).file_bytes.empty());
}

}  // namespace
}  // namespace shardsafe
