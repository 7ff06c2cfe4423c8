#include "shardsafe/tools.h"

#include <cmath>
#include <set>
#include <cstring>

#include <nlohmann/json.hpp>

#include "engine/load/convert.h"
#include "engine/load/load_internal.h"
#include "format/index_packed.h"

namespace shardsafe {
namespace {

TensorDiff Verdict(const std::string& key, const char* status) {
  TensorDiff d;
  d.key = key;
  d.status = status;
  return d;
}

bool IsFloat(DType d) {
  return d == DType::kF16 || d == DType::kBF16 || d == DType::kF32 || d == DType::kF64;
}

// Reads elements [begin, end) of `key` (of `dtype` and `shape`) from
// `src` into `out`.
Status ReadPiece(const CheckpointSource& src, FileSystem& fs, const std::string& key,
                 DType dtype, const Shape& shape, uint64_t begin, uint64_t end,
                 std::vector<char>* out) {
  out->resize(*NumBytes(dtype, end - begin));
  LoadRequest req;
  req.tensors.push_back({key, dtype, shape, {Box::Whole(shape), FlatRange{begin, end}},
                         out->data()});
  LoadOptions opts;
  opts.io_threads = 1;
  LoadResult ignored;
  return LoadFromSource(req, src, /*blobs_of_rank=*/std::nullopt, fs, opts, &ignored);
}

// Counts differing elements and tracks the largest float difference.
void ComparePiece(DType dtype, const std::vector<char>& a, const std::vector<char>& b,
                  uint64_t n, TensorDiff* diff) {
  if (std::memcmp(a.data(), b.data(), a.size()) == 0) return;
  const int bytes = std::max(1, DTypeBits(dtype) / 8);
  if (!IsFloat(dtype) || IsSubByte(dtype)) {
    for (size_t i = 0; i < a.size(); i += bytes) {
      diff->differing_elements += std::memcmp(&a[i], &b[i], bytes) != 0;
    }
    return;
  }
  std::vector<double> da(n), db(n);
  ConvertElements(a.data(), dtype, da.data(), DType::kF64, n);
  ConvertElements(b.data(), dtype, db.data(), DType::kF64, n);
  double worst = diff->max_abs_diff.value_or(0);
  for (uint64_t i = 0; i < n; ++i) {
    if (std::memcmp(&a[i * bytes], &b[i * bytes], bytes) == 0) continue;
    diff->differing_elements++;
    const double d = std::fabs(da[i] - db[i]);
    worst = std::isnan(d) ? d : (std::isnan(worst) ? worst : std::max(worst, d));
  }
  diff->max_abs_diff = worst;
}

// Tensor `key` (of tensor ta of A and tb of B, their packed tensors).
Result<TensorDiff> CompareTensor(const CheckpointSource& a, FileSystem& fs_a, size_t ta,
                                 const CheckpointSource& b, FileSystem& fs_b, size_t tb,
                                 const std::string& key, uint64_t piece_bytes) {
  const Shape shape = a.packed->shape(ta);
  const DType dtype = a.packed->dtype(ta);
  TensorDiff diff = Verdict(key, "equal");
  if (shape != b.packed->shape(tb)) return Verdict(key, "shape differs");
  if (dtype != b.packed->dtype(tb)) return Verdict(key, "dtype differs");
  SS_ASSIGN_OR_RETURN(diff.elements, NumElements(shape));
  // Pieces of a multiple of 8 elements keep sub-byte dtypes on byte boundaries.
  const uint64_t step =
      std::max<uint64_t>(8, piece_bytes / std::max(1, DTypeBits(dtype) / 8) / 8 * 8);
  std::vector<char> pa, pb;
  for (uint64_t begin = 0; begin < diff.elements; begin += step) {
    const uint64_t end = std::min(diff.elements, begin + step);
    SS_RETURN_IF_ERROR(ReadPiece(a, fs_a, key, dtype, shape, begin, end, &pa).WithContext("A"));
    SS_RETURN_IF_ERROR(ReadPiece(b, fs_b, key, dtype, shape, begin, end, &pb).WithContext("B"));
    ComparePiece(dtype, pa, pb, end - begin, &diff);
  }
  if (diff.differing_elements) diff.status = "differs";
  return diff;
}

// JSON pointers to where `a` and `b` differ: the paths of a JSON patch
// from one to the other (nlohmann's, which names a changed value, an added
// or removed key, and recurses into objects and arrays), each once.
std::vector<std::string> DifferingValues(const nlohmann::json& a, const nlohmann::json& b) {
  std::set<std::string> paths;
  for (const nlohmann::json& op : nlohmann::json::diff(a, b)) {
    paths.insert(op.at("path").get<std::string>());
  }
  return {paths.begin(), paths.end()};
}

}  // namespace

bool DiffReport::identical() const {
  if (!values_equal) return false;
  for (const auto& t : tensors) {
    if (t.status != "equal") return false;
  }
  return true;
}

Result<DiffReport> DiffCheckpoints(const std::string& a, const std::string& b, FileSystem* fsp,
                                   uint64_t piece_bytes) {
  SS_ASSIGN_OR_RETURN(FileSystem * fs_a, FileSystemFor(a, fsp));
  SS_ASSIGN_OR_RETURN(FileSystem * fs_b, FileSystemFor(b, fsp));
  SS_ASSIGN_OR_RETURN(CheckpointSource sa, OpenSourcePacked(*fs_a, a));
  SS_ASSIGN_OR_RETURN(CheckpointSource sb, OpenSourcePacked(*fs_b, b));
  DiffReport report;
  // Equal as JSON (1 and 1.0, key order), not as text.
  auto parse = [](const std::string& t) { return nlohmann::json::parse(t, nullptr, false); };
  const nlohmann::json va = parse(sa.index.values), vb = parse(sb.index.values);
  report.values_equal = va == vb;
  if (!report.values_equal) report.differing_values = DifferingValues(va, vb);
  const PackedTensors& ta = *sa.packed;
  const PackedTensors& tb = *sb.packed;
  for (size_t t = 0; t < ta.size(); ++t) {
    const std::string key(ta.key(t));
    const std::optional<size_t> in_b = tb.Find(key);
    if (!in_b) {
      report.tensors.push_back(Verdict(key, "only in A"));
      continue;
    }
    SS_ASSIGN_OR_RETURN(TensorDiff d,
                        CompareTensor(sa, *fs_a, t, sb, *fs_b, *in_b, key, piece_bytes));
    report.tensors.push_back(std::move(d));
  }
  for (size_t t = 0; t < tb.size(); ++t) {
    if (!ta.Find(tb.key(t))) report.tensors.push_back(Verdict(std::string(tb.key(t)), "only in B"));
  }
  std::sort(report.tensors.begin(), report.tensors.end(),
            [](const TensorDiff& x, const TensorDiff& y) { return x.key < y.key; });
  return report;
}

}  // namespace shardsafe
