// Randomized end-to-end round trips: random dtypes and shapes, random save
// layouts (replicated, uneven box splits, ZeRO flat shards, split-then-flat)
// on 1-4 thread ranks (planned on rank 0 or by all ranks together, with a
// JSON index or a chunk table), loaded into random other layouts on 1-4
// ranks, every byte checked against the element-by-element oracle.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "testing/test_util.h"

namespace shardsafe {
namespace {

uint64_t CheckpointBytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

using Rng = std::mt19937_64;

uint64_t Uniform(Rng& rng, uint64_t lo, uint64_t hi) {  // inclusive
  return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
}

// Quantum for cuts of a dimension: sub-byte dtypes cut the last dim and
// flat ranges at multiples of 4 elements (covers F4 and F6).
uint64_t Quantum(DType dtype) { return IsSubByte(dtype) ? 4 : 1; }

// k+1 non-decreasing cut points from 0 to n, at multiples of q.
std::vector<uint64_t> Cuts(Rng& rng, uint64_t n, uint64_t k, uint64_t q) {
  std::vector<uint64_t> cuts = {0, n};
  for (uint64_t i = 1; i < k; ++i) cuts.push_back(Uniform(rng, 0, n / q) * q);
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

struct Tensor {
  std::string key;
  DType dtype;
  Shape shape;
};

Tensor RandomTensor(Rng& rng, int id) {
  Tensor t{"t" + std::to_string(id), static_cast<DType>(Uniform(rng, 0, kNumDTypes - 1)), {}};
  const uint64_t rank = Uniform(rng, IsSubByte(t.dtype) ? 1 : 0, 4);
  for (uint64_t d = 0; d < rank; ++d) t.shape.push_back(Uniform(rng, 0, 9) == 0 ? 0 : Uniform(rng, 1, 7));
  if (IsSubByte(t.dtype)) t.shape.back() = 4 * Uniform(rng, 1, 3);
  return t;
}

uint64_t Volume(const Shape& s) {
  uint64_t v = 1;
  for (uint64_t d : s) v *= d;
  return v;
}

Slice SplitAlong(const Tensor& t, size_t dim, const std::vector<uint64_t>& cuts, size_t part) {
  Slice s{Box::Whole(t.shape), std::nullopt};
  s.box.offset[dim] = cuts[part];
  s.box.size[dim] = cuts[part + 1] - cuts[part];
  return s;
}

// The slices rank r holds in a random save layout of `world` ranks.
std::vector<std::vector<Slice>> SaveLayout(Rng& rng, const Tensor& t, int world) {
  std::vector<std::vector<Slice>> out(world);
  const Slice whole{Box::Whole(t.shape), std::nullopt};
  const uint64_t q = Quantum(t.dtype), n = Volume(t.shape);
  const int mode = t.shape.empty() ? 0 : static_cast<int>(Uniform(rng, 0, 3));
  const size_t dim = t.shape.empty() ? 0 : Uniform(rng, 0, t.shape.size() - 1);
  const uint64_t dq = dim + 1 == t.shape.size() ? q : 1;
  if (mode == 1) {  // uneven box split, replicated when world > parts
    const auto k = Uniform(rng, 1, world);
    const auto cuts = Cuts(rng, t.shape[dim], k, dq);
    for (int r = 0; r < world; ++r) out[r].push_back(SplitAlong(t, dim, cuts, r % k));
  } else if (mode == 2 && n > 0) {  // ZeRO: flat shards of the whole tensor
    const auto cuts = Cuts(rng, n, world, q);
    for (int r = 0; r < world; ++r) out[r].push_back({whole.box, FlatRange{cuts[r], cuts[r + 1]}});
  } else if (mode == 3 && world >= 2) {  // box split, each part flat-split in two
    const uint64_t k = world / 2;
    const auto cuts = Cuts(rng, t.shape[dim], k, dq);
    std::vector<std::vector<uint64_t>> halves(k);
    for (uint64_t p = 0; p < k; ++p) {
      halves[p] = Cuts(rng, Volume(SplitAlong(t, dim, cuts, p).box.size), 2, q);
    }
    for (int r = 0; r < world; ++r) {
      const uint64_t p = (r / 2) % k, h = r % 2;
      Slice s = SplitAlong(t, dim, cuts, p);
      s.flat = FlatRange{halves[p][h], halves[p][h + 1]};
      out[r].push_back(s);
    }
  } else {
    for (int r = 0; r < world; ++r) out[r].push_back(whole);
  }
  return out;
}

// A random slice to load: whole, a random sub-box, or a flat range of one.
Slice LoadSlice(Rng& rng, const Tensor& t) {
  Slice s{Box::Whole(t.shape), std::nullopt};
  if (t.shape.empty() || Uniform(rng, 0, 3) == 0) return s;
  for (size_t d = 0; d < t.shape.size(); ++d) {
    const uint64_t q = d + 1 == t.shape.size() ? Quantum(t.dtype) : 1;
    const auto cuts = Cuts(rng, t.shape[d], 3, q);
    s.box.offset[d] = cuts[1];
    s.box.size[d] = cuts[2] - cuts[1];
  }
  if (Uniform(rng, 0, 1)) {
    const auto cuts = Cuts(rng, Volume(s.box.size), 3, Quantum(t.dtype));
    s.flat = FlatRange{cuts[1], cuts[2]};
  }
  return s;
}

class RandomRoundTripTest : public ::testing::TestWithParam<int> {};

TEST_P(RandomRoundTripTest, LoadMatchesOracle) {
  Rng rng(1000 + GetParam());
  const std::string root = testing::MakeTempDir("random");
  for (int iter = 0; iter < 6; ++iter) {
    const int save_world = static_cast<int>(Uniform(rng, 1, 4));
    const int load_world = static_cast<int>(Uniform(rng, 1, 4));
    std::vector<Tensor> tensors;
    for (int i = 0, n = static_cast<int>(Uniform(rng, 1, 5)); i < n; ++i) {
      tensors.push_back(RandomTensor(rng, i));
    }
    std::vector<std::vector<OwnedShard>> shards(save_world);
    for (const Tensor& t : tensors) {
      auto layout = SaveLayout(rng, t, save_world);
      for (int r = 0; r < save_world; ++r) {
        for (const Slice& s : layout[r]) shards[r].push_back(MakeShard(t.key, t.dtype, t.shape, s));
      }
    }
    std::vector<std::vector<OwnedTarget>> targets(load_world);
    for (int r = 0; r < load_world; ++r) {
      for (const Tensor& t : tensors) {
        if (Uniform(rng, 0, 4)) targets[r].push_back(MakeTarget(t.key, t.dtype, t.shape, LoadSlice(rng, t)));
      }
    }
    SaveOptions sopts;
    sopts.max_file_bytes = Uniform(rng, 0, 1) ? 64 : (1 << 20);  // many files or one
    sopts.direct_io = Uniform(rng, 0, 1);
    // Half planned by all ranks together (a chunk table always), half on
    // rank 0 (a JSON index, or a table from one chunk on).
    sopts.distributed_plan_min_ranks = Uniform(rng, 0, 1) ? 1 : uint64_t{1} << 40;
    sopts.chunk_table_min_chunks = Uniform(rng, 0, 1) ? 1 : uint64_t{1} << 40;
    const std::string path = root + "/ck" + std::to_string(iter);
    testing::RunRanks(save_world, [&](int r, Comm& comm) {
      SaveState state;
      for (const auto& s : shards[r]) state.tensors.push_back(s.View());
      Status st = Save(state, path, comm, sopts).status();
      ASSERT_TRUE(st.ok()) << st.ToString();
    });
    LoadOptions lopts;
    lopts.allow_partial = true;
    lopts.io_threads = static_cast<int>(Uniform(rng, 1, 3));
    testing::RunRanks(load_world, [&](int r, Comm& comm) {
      LoadRequest req;
      for (auto& t : targets[r]) req.tensors.push_back(t.target);
      auto res = Load(req, path, comm, lopts);
      ASSERT_TRUE(res.ok()) << res.status().ToString();
      EXPECT_TRUE(res->missing.empty());
      // Reads never overlap (narrow gaps are read through): at most the
      // checkpoint's bytes.
      EXPECT_LE(res->bytes_read, CheckpointBytes(path));
    });
    for (int r = 0; r < load_world; ++r) {
      for (const auto& t : targets[r]) {
        EXPECT_TRUE(MatchesOracle(t)) << "iter " << iter << " rank " << r << " " << t.target.key
                                      << " " << DTypeName(t.target.dtype) << " "
                                      << ShapeToString(t.target.shape) << " "
                                      << SliceToString(t.target.slice);
      }
    }
  }
  std::filesystem::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomRoundTripTest, ::testing::Range(0, 12));

}  // namespace
}  // namespace shardsafe
