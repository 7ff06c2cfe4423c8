#include "hf/export_plan.h"

#include <algorithm>
#include <cstdio>

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

// The output entries of one source tensor (several for a grouped expert
// tensor), before renaming.
Result<std::vector<ExportEntry>> EntriesOf(const std::string& key, const std::string& name,
                                           const IndexTensor& t, const ExportHfOptions& options) {
  const DType out = options.dtype && IsFloat(t.dtype) ? *options.dtype : t.dtype;
  std::vector<ExportEntry> entries;
  SS_ASSIGN_OR_RETURN(std::vector<ExpertPart> parts, SplitExperts(name, t.shape, options.experts));
  if (parts.empty()) parts.push_back({name, Box::Whole(t.shape), t.shape});
  for (ExpertPart& p : parts) {
    SS_ASSIGN_OR_RETURN(uint64_t n, NumElements(p.shape));
    SS_ASSIGN_OR_RETURN(uint64_t bytes, NumBytes(out, n));
    entries.push_back({std::move(p.name), key, std::move(p.box), std::move(p.shape), t.dtype,
                       out, bytes});
  }
  return entries;
}

std::string IndexJson(const ExportPlan& plan) {
  nlohmann::json weight_map = nlohmann::json::object();
  for (const ExportShard& s : plan.shards) {
    for (uint32_t e : s.entries) weight_map[plan.entries[e].name] = s.file;
  }
  nlohmann::json index = {
      {"metadata", {{"total_parameters", plan.total_parameters}, {"total_size", plan.total_bytes}}},
      {"weight_map", std::move(weight_map)}};
  // json.dumps(indent=2, sort_keys=True): nlohmann objects are sorted maps.
  return index.dump(2, ' ', /*ensure_ascii=*/true) + "\n";
}

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

Result<ExportPlan> PlanExport(const IndexTensors& tensors,
                              const ExportHfOptions& options) {
  if (options.dtype && !IsFloat(*options.dtype)) {
    return InvalidArgumentError("export dtype must be F16, BF16, F32 or F64, not " +
                                std::string(DTypeName(*options.dtype)));
  }
  SS_RETURN_IF_ERROR(ValidateExpertRules(options.experts));
  SS_ASSIGN_OR_RETURN(KeyFilter filter, KeyFilter::Create(options));
  SS_ASSIGN_OR_RETURN(Renamer renamer, Renamer::Create(options));
  ExportPlan plan;
  std::map<std::string, std::string> source_of;  // output name -> source key
  for (const auto& [key, t] : tensors) {
    std::optional<std::string> name = filter.Select(key);
    if (!name) continue;
    SS_ASSIGN_OR_RETURN(std::vector<ExportEntry> entries, EntriesOf(key, *name, t, options));
    for (ExportEntry& e : entries) {
      Result<std::string> renamed = renamer.Apply(e.name);
      if (!renamed.ok()) return renamed.status().WithContext("renaming \"" + e.name + "\"");
      e.name = std::move(*renamed);
      if (e.name.empty()) return InvalidArgumentError("tensor \"" + key + "\" renamed to \"\"");
      auto [it, added] = source_of.emplace(e.name, key);
      if (!added) {
        return InvalidArgumentError("two tensors would be exported as \"" + e.name +
                                    "\": from \"" + it->second + "\" and \"" + key + "\"");
      }
      plan.total_bytes += e.bytes;
      plan.total_parameters += *NumElements(e.shape);
      plan.entries.push_back(std::move(e));
    }
  }
  if (plan.entries.empty()) {
    return InvalidArgumentError("nothing to export: no tensor of the " +
                                std::to_string(tensors.size()) +
                                " in the source is selected by the prefix and patterns");
  }
  std::sort(plan.entries.begin(), plan.entries.end(),
            [](const ExportEntry& a, const ExportEntry& b) { return NaturalLess(a.name, b.name); });
  std::vector<uint64_t> sizes;
  for (const ExportEntry& e : plan.entries) sizes.push_back(e.bytes);
  const auto groups = AssignShards(sizes, std::max<uint64_t>(options.max_shard_bytes, 1));
  for (size_t i = 0; i < groups.size(); ++i) {
    ExportShard shard{ShardFileName(options.weights_name, i, groups.size()), groups[i], 0};
    for (uint32_t e : shard.entries) shard.bytes += plan.entries[e].bytes;
    plan.shards.push_back(std::move(shard));
  }
  if (plan.shards.size() > 1) {
    plan.index_file = options.weights_name + ".safetensors.index.json";
    plan.index_json = IndexJson(plan);
  }
  return plan;
}

}  // namespace shardsafe
