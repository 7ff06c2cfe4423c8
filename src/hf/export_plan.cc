#include "hf/export_plan.h"

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <optional>

#include <nlohmann/json.hpp>

#include "hf/names.h"
#include "shardsafe/source.h"

namespace shardsafe {
namespace {

bool IsDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Compares two digit strings as numbers (any length).
int CompareNumbers(std::string_view a, std::string_view b) {
  while (a.size() > 1 && a.front() == '0') a.remove_prefix(1);
  while (b.size() > 1 && b.front() == '0') b.remove_prefix(1);
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a.compare(b);
}

std::string_view NextPart(std::string_view* s) {
  const size_t dot = s->find('.');
  std::string_view part = s->substr(0, dot);
  s->remove_prefix(dot == std::string_view::npos ? s->size() : dot + 1);
  return part;
}

bool IsFloat(DType d) {
  return d == DType::kF16 || d == DType::kBF16 || d == DType::kF32 || d == DType::kF64;
}

std::string ShardFileName(const std::string& weights_name, size_t i, size_t n) {
  if (n == 1) return weights_name + ".safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05zu-of-%05zu.safetensors", i + 1, n);
  return weights_name + buf;
}

}  // namespace

std::string_view ExportPlan::Key(const ExportEntry& e, const PackedTensors& tensors) const {
  return tensors.key(e.tensor);
}

std::string_view ExportPlan::Name(const ExportEntry& e, const PackedTensors& tensors) const {
  return e.name == ExportEntry::kKey ? Key(e, tensors) : std::string_view(names[e.name]);
}

Box ExportPlan::BoxOf(const ExportEntry& e, const PackedTensors& tensors) const {
  return e.part == ExportEntry::kWhole ? Box::Whole(tensors.shape(e.tensor)) : parts[e.part].box;
}

Shape ExportPlan::ShapeOf(const ExportEntry& e, const PackedTensors& tensors) const {
  const std::span<const uint64_t> d = Dims(e, tensors);
  return Shape(d.begin(), d.end());
}

std::span<const uint64_t> ExportPlan::Dims(const ExportEntry& e,
                                           const PackedTensors& tensors) const {
  if (e.part == ExportEntry::kWhole) return tensors.dims(e.tensor);
  return parts[e.part].shape;
}

std::string IndexJson(const ExportPlan& plan, const PackedTensors& tensors) {
  nlohmann::json weight_map = nlohmann::json::object();
  for (const ExportShard& s : plan.shards) {
    for (uint32_t e : s.entries) {
      weight_map[std::string(plan.Name(plan.entries[e], tensors))] = s.file;
    }
  }
  nlohmann::json index = {
      {"metadata", {{"total_parameters", plan.total_parameters}, {"total_size", plan.total_bytes}}},
      {"weight_map", std::move(weight_map)}};
  // json.dumps(indent=2, sort_keys=True): nlohmann objects are sorted maps.
  return index.dump(2, ' ', /*ensure_ascii=*/true) + "\n";
}

namespace {

}  // namespace

bool NaturalLess(std::string_view a, std::string_view b) {
  std::string_view x = a, y = b;
  while (!x.empty() && !y.empty()) {
    const std::string_view px = NextPart(&x), py = NextPart(&y);
    const int c = IsDigits(px) && IsDigits(py) ? CompareNumbers(px, py) : px.compare(py);
    if (c != 0) return c < 0;
  }
  if (x.empty() != y.empty()) return x.empty();
  return a < b;  // equal as numbers ("01" and "1"): byte order decides
}

std::vector<std::vector<uint32_t>> AssignShards(const std::vector<uint64_t>& sizes,
                                                uint64_t max_shard_bytes) {
  std::vector<std::vector<uint32_t>> shards;
  std::vector<uint32_t> current;
  uint64_t current_bytes = 0;
  for (uint32_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (current_bytes + sizes[i] > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += sizes[i];
  }
  if (!current.empty()) shards.push_back(std::move(current));
  return shards;
}

namespace {

// Adds the output entries of source tensor t, selected under `name` (its
// key less the prefix): several for a grouped expert tensor, renamed.
Status AddEntries(const PackedTensors& tensors, size_t t, const std::string& name,
                  const Renamer& renamer, const ExportHfOptions& options, ExportPlan* plan) {
  const DType src = tensors.dtype(t);
  const DType out = options.dtype && IsFloat(src) ? *options.dtype : src;
  const Shape shape = tensors.shape(t);
  SS_ASSIGN_OR_RETURN(std::vector<ExpertPart> parts, SplitExperts(name, shape, options.experts));
  if (parts.empty()) parts.push_back({name, Box::Whole(shape), shape});
  const bool whole = parts.size() == 1 && parts[0].box == Box::Whole(shape);
  for (ExpertPart& p : parts) {
    Result<std::string> renamed = renamer.Apply(p.name);
    if (!renamed.ok()) return renamed.status().WithContext("renaming \"" + p.name + "\"");
    if (renamed->empty()) {
      return InvalidArgumentError("tensor \"" + std::string(tensors.key(t)) + "\" renamed to \"\"");
    }
    SS_ASSIGN_OR_RETURN(uint64_t n, NumElements(p.shape));
    SS_ASSIGN_OR_RETURN(uint64_t bytes, NumBytes(out, n));
    ExportEntry e;
    if (*renamed != tensors.key(t)) {
      e.name = static_cast<uint32_t>(plan->names.size());
      plan->names.push_back(std::move(*renamed));
    }
    e.tensor = static_cast<uint32_t>(t);
    if (!whole) {
      e.part = static_cast<uint32_t>(plan->parts.size());
      plan->parts.push_back({std::move(p.box), std::move(p.shape)});
    }
    e.src_dtype = src;
    e.dtype = out;
    e.bytes = bytes;
    plan->total_bytes += bytes;
    plan->total_parameters += n;
    plan->entries.push_back(std::move(e));
  }
  return Status();
}

// Sorts the entries in natural order of their names; InvalidArgument
// naming both sources where two share a name (of those, the pair whose
// second entry was made first, as a check at each entry would find it).
Status SortEntries(const PackedTensors& tensors, ExportPlan* plan) {
  std::vector<uint32_t> order(plan->entries.size());
  std::iota(order.begin(), order.end(), 0u);
  auto name = [&](uint32_t i) { return plan->Name(plan->entries[i], tensors); };
  std::stable_sort(order.begin(), order.end(),
                   [&](uint32_t a, uint32_t b) { return NaturalLess(name(a), name(b)); });
  std::optional<size_t> clash;  // in `order`: the second of two of one name
  for (size_t i = 1; i < order.size(); ++i) {
    if (name(order[i]) == name(order[i - 1]) && (!clash || order[i] < order[*clash])) clash = i;
  }
  if (clash) {
    const ExportEntry& a = plan->entries[order[*clash - 1]];
    const ExportEntry& b = plan->entries[order[*clash]];
    return InvalidArgumentError("two tensors would be exported as \"" +
                                std::string(plan->Name(b, tensors)) + "\": from \"" +
                                std::string(plan->Key(a, tensors)) + "\" and \"" +
                                std::string(plan->Key(b, tensors)) + "\"");
  }
  std::vector<ExportEntry> sorted;
  sorted.reserve(order.size());
  for (uint32_t i : order) sorted.push_back(std::move(plan->entries[i]));
  plan->entries = std::move(sorted);
  return Status();
}

}  // namespace

Result<ExportPlan> PlanExport(const PackedTensors& tensors, const ExportHfOptions& options) {
  if (options.dtype && !IsFloat(*options.dtype)) {
    return InvalidArgumentError("export dtype must be F16, BF16, F32 or F64, not " +
                                std::string(DTypeName(*options.dtype)));
  }
  SS_RETURN_IF_ERROR(ValidateExpertRules(options.experts));
  SS_ASSIGN_OR_RETURN(KeyFilter filter, KeyFilter::Create(options));
  SS_ASSIGN_OR_RETURN(Renamer renamer, Renamer::Create(options));
  ExportPlan plan;
  for (size_t t = 0; t < tensors.size(); ++t) {
    std::optional<std::string> name = filter.Select(std::string(tensors.key(t)));
    if (name) SS_RETURN_IF_ERROR(AddEntries(tensors, t, *name, renamer, options, &plan));
  }
  if (plan.entries.empty()) {
    return InvalidArgumentError("nothing to export: no tensor of the " +
                                std::to_string(tensors.size()) +
                                " in the source is selected by the prefix and patterns");
  }
  SS_RETURN_IF_ERROR(SortEntries(tensors, &plan));
  std::vector<uint64_t> sizes;
  for (const ExportEntry& e : plan.entries) sizes.push_back(e.bytes);
  const auto groups = AssignShards(sizes, std::max<uint64_t>(options.max_shard_bytes, 1));
  for (size_t i = 0; i < groups.size(); ++i) {
    ExportShard shard{ShardFileName(options.weights_name, i, groups.size()), groups[i], 0};
    for (uint32_t e : shard.entries) shard.bytes += plan.entries[e].bytes;
    plan.shards.push_back(std::move(shard));
  }
  if (plan.shards.size() > 1) plan.index_file = options.weights_name + ".safetensors.index.json";
  return plan;
}

}  // namespace shardsafe
