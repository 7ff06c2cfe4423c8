// The reader is a stack of frames, one per open container: the index's own
// objects (kObject) collect their fields' values, the arrays and objects
// of objects (kObjects, kNamed) count or name their elements, an array of
// integers (kNumbers) collects them, and a kJson frame builds one JSON
// value as nlohmann::json (its open containers on json_open_). Every value
// event goes to the top frame; a value that ends is delivered to the frame
// below it. The stack holds at most seven frames outside a JSON value
// (document, top level, tensors, tensor, chunks, chunk, numbers).
#include "format/index_sax.h"

#include <algorithm>
#include <cstdio>

namespace shardsafe::internal {
namespace {

using json = nlohmann::json;
using Kind = FieldValue::Kind;
using Type = json::value_t;

constexpr size_t kShown = 40;  // bytes of a value an error message shows

std::string Cut(std::string s) { return s.size() > kShown ? s.substr(0, kShown) + "..." : s; }

// Bytes from the input for a message: printable ASCII as is, others \xNN.
std::string Shown(std::string_view bytes) {
  std::string out;
  for (const unsigned char c : bytes.substr(0, kShown)) {
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      char hex[5];
      std::snprintf(hex, sizeof hex, "\\x%02X", c);
      out += hex;
    }
  }
  return bytes.size() > kShown ? out + "..." : out;
}

FieldValue Other(std::string text) {
  FieldValue v;
  v.kind = Kind::kOther;
  v.text = std::move(text);
  return v;
}

FieldValue OfKind(Kind kind, uint64_t number) {
  FieldValue v;
  v.kind = kind;
  v.number = number;
  return v;
}

const char* ContainerName(bool object) { return object ? "a JSON object" : "a JSON array"; }

// Compact JSON text, as the writer's canonical form (engine/save/user_json.cc).
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

FieldValue JsonValue(const json& j) {
  FieldValue v;
  v.kind = Kind::kJson;
  v.json_type = j.is_object() ? 'o' : j.is_array() ? 'a' : 's';
  v.text = Dump(j);
  return v;
}

}  // namespace

void FieldValue::Reset() {
  kind = Kind::kAbsent;
  bad = -1;
  text.clear();
  numbers.clear();
}

std::string Describe(const FieldValue& v) {
  switch (v.kind) {
    case Kind::kNumber: return std::to_string(v.number);
    case Kind::kString: return Cut(Dump(json(v.text)));
    case Kind::kBool: return v.number ? "true" : "false";
    case Kind::kNumbers: return ContainerName(false);
    case Kind::kJson:
    case Kind::kContainer:
      return v.json_type == 's' ? Cut(v.text) : ContainerName(v.json_type == 'o');
    case Kind::kOther: return Cut(v.text);
    case Kind::kAbsent: break;
  }
  return "nothing";
}

IndexSax::IndexSax(std::span<const ObjectSpec> schema, IndexListener* listener)
    : schema_(schema), listener_(listener), fields_(schema.size()) {
  stack_.emplace_back(Frame::Type::kDocument);
}

// --- Values -------------------------------------------------------------------

bool IndexSax::null() { return WantsJson() ? AddJson(nullptr) : Scalar(Other("null")); }

bool IndexSax::boolean(bool value) {
  return WantsJson() ? AddJson(value) : Scalar(OfKind(Kind::kBool, value));
}

// Called for negative integers (and -0, which the index reads as 0).
bool IndexSax::number_integer(json::number_integer_t value) {
  if (WantsJson()) return AddJson(value);
  if (value == 0) return Scalar(OfKind(Kind::kNumber, 0));
  return Scalar(Other(std::to_string(value)));
}

bool IndexSax::number_unsigned(json::number_unsigned_t value) {
  return WantsJson() ? AddJson(value) : Scalar(OfKind(Kind::kNumber, value));
}

// A literal beyond a double's range is nlohmann's error (parse_error).
bool IndexSax::number_float(json::number_float_t value, const json::string_t& literal) {
  return WantsJson() ? AddJson(value) : Scalar(Other(literal));
}

bool IndexSax::string(json::string_t& value) {
  if (WantsJson()) return AddJson(std::move(value));
  FieldValue v;
  v.kind = Kind::kString;
  v.text = std::move(value);
  return Scalar(std::move(v));
}

bool IndexSax::binary(json::binary_t&) {
  return Stop(DataLossError("invalid JSON: a binary value"));
}

// True where the next value is part of a JSON value being built, or is a
// whole one (a kJson field's).
bool IndexSax::WantsJson() const {
  const Frame& f = stack_.back();
  return f.type == Frame::Type::kJson ||
         (f.type == Frame::Type::kObject && f.field >= 0 &&
          schema_[f.kind][f.field].kind == FieldKind::kJson);
}

bool IndexSax::Scalar(FieldValue value) {
  Frame& f = stack_.back();
  if (f.type == Frame::Type::kObjects || f.type == Frame::Type::kNumbers) ++f.count;
  return Deliver(std::move(value));
}

// `value` (the whole of it) goes to the top frame.
bool IndexSax::Deliver(FieldValue value) {
  Frame& f = stack_.back();
  switch (f.type) {
    case Frame::Type::kDocument:
      listener_->NotAnObject(0, 0, value);
      break;
    case Frame::Type::kObject:
      if (f.field >= 0) fields_[f.kind][f.field] = std::move(value);  // else unknown: dropped
      break;
    case Frame::Type::kObjects:
      listener_->NotAnObject(f.kind, f.count - 1, value);
      break;
    case Frame::Type::kNamed:
      listener_->NotAnObject(f.kind, 0, value);
      break;
    case Frame::Type::kNumbers:
      if (value.kind == Kind::kNumber) {
        numbers_.push_back(value.number);
      } else if (numbers_bad_ < 0) {
        numbers_bad_ = static_cast<int64_t>(f.count - 1);
        numbers_bad_text_ = Describe(value);
      }
      break;
    case Frame::Type::kJson:  // unreachable: AddJson takes those
      break;
  }
  return true;
}

// --- Containers ---------------------------------------------------------------

bool IndexSax::start_object(std::size_t) { return Open(Type::object); }
bool IndexSax::start_array(std::size_t) { return Open(Type::array); }

bool IndexSax::Open(Type type) {
  if (++depth_ > kMaxJsonNesting) {
    return Stop(DataLossError("JSON nested deeper than " + std::to_string(kMaxJsonNesting) +
                              " levels"));
  }
  Frame& f = stack_.back();
  const bool object = type == Type::object;
  if (f.type == Frame::Type::kObjects || f.type == Frame::Type::kNumbers) ++f.count;
  if (object && f.type == Frame::Type::kDocument) return OpenObject(0, 0);
  if (object && f.type == Frame::Type::kObjects) return OpenObject(f.kind, f.count - 1);
  if (object && f.type == Frame::Type::kNamed) return OpenObject(f.kind, 0);
  if (f.type == Frame::Type::kObject && f.field >= 0) {
    const FieldSpec& spec = schema_[f.kind][f.field];
    FieldValue& value = fields_[f.kind][f.field];
    if (!object && spec.kind == FieldKind::kNumbers) {
      numbers_.clear();
      numbers_bad_ = -1;
      stack_.emplace_back(Frame::Type::kNumbers);
      return true;
    }
    if ((!object && spec.kind == FieldKind::kObjects) || (object && spec.kind == FieldKind::kNamed)) {
      value.kind = Kind::kContainer;
      value.json_type = object ? 'o' : 'a';
      stack_.emplace_back(object ? Frame::Type::kNamed : Frame::Type::kObjects, spec.child);
      return true;
    }
  }
  // User JSON, an unknown field's value, or a value of the wrong type:
  // built whole (so that its keys are checked too), then kept or dropped.
  return OpenJson(type);
}

bool IndexSax::OpenObject(int kind, size_t index) {
  stack_.emplace_back(Frame::Type::kObject, kind, index);
  std::vector<FieldValue>& fields = fields_[kind];
  fields.resize(schema_[kind].size());
  for (FieldValue& v : fields) v.Reset();
  return true;
}

bool IndexSax::key(json::string_t& key) {
  Frame& f = stack_.back();
  if (f.type == Frame::Type::kJson) {
    if (json_open_.back()->contains(key)) Repeated(key);
    json_keys_.back() = std::move(key);
    return true;
  }
  if (f.type == Frame::Type::kNamed) {
    f.key = std::move(key);
    if (!listener_->Name(f.kind, f.key)) Repeated(f.key);
    return true;
  }
  // kObject: a known field, read once, or an unknown one, skipped.
  const ObjectSpec spec = schema_[f.kind];
  const auto known = std::find_if(spec.begin(), spec.end(),
                                  [&](const FieldSpec& s) { return s.name == key; });
  if (known != spec.end()) {
    f.field = static_cast<int>(known - spec.begin());
    if (fields_[f.kind][f.field].kind != Kind::kAbsent) Repeated(key);
    return true;
  }
  f.field = -1;
  f.key = std::move(key);
  if (!f.unknown.insert(f.key).second) Repeated(f.key);
  return true;
}

bool IndexSax::end_object() {
  --depth_;
  Frame& f = stack_.back();
  if (f.type == Frame::Type::kJson) return CloseJson();
  const Frame ended = std::move(f);
  stack_.pop_back();
  if (ended.type == Frame::Type::kObject) {
    listener_->End(ended.kind, ended.count, fields_[ended.kind]);
  }
  return true;
}

bool IndexSax::end_array() {
  --depth_;
  Frame& f = stack_.back();
  if (f.type == Frame::Type::kJson) return CloseJson();
  if (f.type == Frame::Type::kNumbers) return FinishNumbers();
  const int kind = f.kind;  // kObjects
  stack_.pop_back();
  listener_->EndObjects(kind);
  return true;
}

bool IndexSax::FinishNumbers() {
  stack_.pop_back();
  const Frame& owner = stack_.back();  // the kObject whose field it is
  FieldValue& value = fields_[owner.kind][owner.field];
  value.kind = Kind::kNumbers;
  value.numbers.assign(numbers_.begin(), numbers_.end());  // exact size: kept in the index
  value.bad = numbers_bad_;
  if (numbers_bad_ >= 0) value.text = std::move(numbers_bad_text_);
  return true;
}

// --- JSON values ----------------------------------------------------------------

bool IndexSax::OpenJson(Type type) {
  if (stack_.back().type != Frame::Type::kJson) {
    stack_.emplace_back(Frame::Type::kJson);
    json_ = json(type);
    json_open_.push_back(&json_);
  } else {
    json& open = *json_open_.back();
    // A child's address holds while it is open: only it grows meanwhile.
    json* child = open.is_array() ? &open.emplace_back(type) : &(open[json_keys_.back()] = json(type));
    json_open_.push_back(child);
  }
  json_keys_.emplace_back();
  return true;
}

bool IndexSax::AddJson(json value) {
  if (stack_.back().type != Frame::Type::kJson) return Deliver(JsonValue(value));  // a kJson field's
  json& open = *json_open_.back();
  if (open.is_array()) {
    open.push_back(std::move(value));
  } else {
    open[json_keys_.back()] = std::move(value);
  }
  return true;
}

bool IndexSax::CloseJson() {
  json_open_.pop_back();
  json_keys_.pop_back();
  if (!json_open_.empty()) return true;
  stack_.pop_back();
  const Frame& f = stack_.back();
  const bool keep = f.type == Frame::Type::kObject && f.field >= 0 &&
                    schema_[f.kind][f.field].kind == FieldKind::kJson;
  FieldValue value = keep ? JsonValue(json_) : Other(ContainerName(json_.is_object()));
  json_ = nullptr;
  return Deliver(std::move(value));
}

// --- Errors ---------------------------------------------------------------------

bool IndexSax::Repeated(std::string_view key) {
  if (repeated_.ok()) {
    repeated_ = DataLossError("duplicate key \"" + std::string(key) + "\" in " + ObjectName());
  }
  return true;
}

bool IndexSax::Stop(Status status) {
  stopped_ = std::move(status);
  return false;
}

bool IndexSax::parse_error(std::size_t position, const std::string& last_token,
                           const nlohmann::detail::exception& ex) {
  // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax
  // error while parsing value - ...; last read: '<token>'" or "[json.
  // exception.out_of_range.406] number overflow parsing '<token>'": without
  // the tag and the line (the byte is given), the token (any bytes, any
  // length) shown short.
  std::string what = ex.what();
  if (const size_t tag = what.find("] "); tag != std::string::npos) what.erase(0, tag + 2);
  if (const size_t line = what.find(": "); what.starts_with("parse error") && line != std::string::npos) {
    what.erase(0, line + 2);
  }
  const size_t at = last_token.empty() ? std::string::npos : what.find(last_token);
  if (at != std::string::npos) what.replace(at, last_token.size(), Shown(last_token));
  return Stop(DataLossError("invalid JSON: " + what + " (byte " + std::to_string(position) + ")"));
}

// The innermost open object as messages name it: "the top-level object",
// "object /tensors/k/chunks/3", "object /values/config".
std::string IndexSax::ObjectName() const {
  std::string path;
  for (size_t i = 1; i + 1 < stack_.size(); ++i) path.append("/").append(Segment(stack_[i]));
  if (stack_.back().type == Frame::Type::kJson) {
    for (size_t i = 0; i + 1 < json_open_.size(); ++i) {
      const json& open = *json_open_[i];
      path.append("/").append(open.is_array() ? std::to_string(open.size() - 1) : json_keys_[i]);
    }
  }
  return path.empty() ? "the top-level object" : "object " + path;
}

// How a path names the value open inside `parent`.
std::string IndexSax::Segment(const Frame& parent) const {
  switch (parent.type) {
    case Frame::Type::kObject:
      return parent.field >= 0 ? std::string(schema_[parent.kind][parent.field].name)
                               : parent.key;
    case Frame::Type::kNamed:
      return parent.key;
    case Frame::Type::kObjects:
    case Frame::Type::kNumbers:
      return std::to_string(parent.count - 1);
    default:
      return "";
  }
}

}  // namespace shardsafe::internal
