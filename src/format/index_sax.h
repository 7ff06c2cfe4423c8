// The index JSON as a stream of events (internal to format/, for
// ParseIndex): an nlohmann::json SAX handler that reads the index's own
// objects (the top level, files, tensors, chunks, blobs and blob chunks)
// one at a time as field values, and hands each to a listener when it ends.
//
// No tree of the document is built. The values of an object's known fields
// are collected in a FieldValue each (a number, a string, an array of
// integers, the compact text of a JSON value), and the listener turns them
// into the CheckpointIndex and checks them. Arrays and objects of objects
// (files, chunks, tensors, blobs) are streamed: only the object being read
// is held. User JSON (`layout`, `metadata`, `values`) and the values of
// unknown fields are built as nlohmann::json trees of that value alone, to
// be dumped or dropped when it ends.
//
// What the reader checks itself, in any object (the index's or user JSON):
// no key twice, nesting at most kMaxJsonNesting arrays and objects deep.
// JSON syntax, UTF-8 and numbers within a double's range are nlohmann's
// (strict: one value, nothing after it, no comments). Everything else is
// the listener's.
//
// Not thread-safe: one reader per parse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardsafe/status.h"
#include "shardsafe/types.h"

namespace shardsafe::internal {

inline constexpr size_t kMaxJsonNesting = 256;

// A field's value as read, before the checks of its field.
struct FieldValue {
  enum class Kind : uint8_t {
    kAbsent,     // not (yet) read
    kNumber,     // an integer in [0, 2^64): `number`
    kString,     // `text`
    kBool,       // `number`: 0 or 1
    kOther,      // any other value; `text` shows it ("-8", "null", "a JSON object")
    kNumbers,    // an array: `numbers`, unless `bad` >= 0
    kJson,       // any value, as compact JSON `text` (nlohmann's dump); `json_type`
    kContainer,  // the array or object a kObjects or kNamed field expects (streamed)
  };
  Kind kind = Kind::kAbsent;
  char json_type = 0;  // kJson: 'o' an object, 'a' an array, 's' a scalar
  // kNumbers: the position of the first element that is not an integer in
  // [0, 2^64) (`text` shows it), or -1.
  int64_t bad = -1;
  uint64_t number = 0;
  std::string text;
  Shape numbers;

  void Reset();  // to kAbsent, keeping the capacity of text and numbers
};

// How error messages show a value: `5`, `"x"`, `a JSON object`, cut at 40
// bytes.
std::string Describe(const FieldValue& value);

// How a field's value is read.
enum class FieldKind : uint8_t {
  kScalar,   // a number, string or boolean (anything else: kOther)
  kNumbers,  // an array of integers
  kJson,     // any JSON value, kept as compact text
  kObjects,  // an array of objects of `child`, streamed
  kNamed,    // an object of objects of `child` by name, streamed
};

struct FieldSpec {
  std::string_view name;
  FieldKind kind = FieldKind::kScalar;
  int child = -1;  // kObjects, kNamed: the kind of object they hold
};

// The fields of one kind of object, in the order its FieldValues take. A
// schema is a list of these indexed by kind; kind 0 is the top level. A
// kind is never nested inside itself.
using ObjectSpec = std::span<const FieldSpec>;

// What the reader tells as the document streams by.
class IndexListener {
 public:
  virtual ~IndexListener() = default;
  // The next object of a kNamed field holding `kind` is called `name`.
  // False if that field had it before (the reader reports the duplicate).
  virtual bool Name(int kind, std::string_view name) = 0;
  // An object of `kind` ended (`index`: its position in a kObjects
  // field). `fields` holds the values of its known fields, in the order of
  // its spec (kAbsent where missing); the listener may move from them.
  virtual void End(int kind, size_t index, std::vector<FieldValue>& fields) = 0;
  // Where an object of `kind` was expected (the top level, an element of a
  // kObjects or kNamed field) another value came.
  virtual void NotAnObject(int kind, size_t index, const FieldValue& value) = 0;
  // A kObjects field holding objects of `kind` ended.
  virtual void EndObjects(int kind) = 0;
};

class IndexSax {
 public:
  using json = nlohmann::json;

  // `schema` and `listener` must outlive the reader.
  IndexSax(std::span<const ObjectSpec> schema, IndexListener* listener);

  // The open object of `kind`'s field values read so far.
  std::vector<FieldValue>& Fields(int kind) { return fields_[kind]; }
  // Why sax_parse returned false: DataLoss "invalid JSON: ..." or "JSON
  // nested deeper than 256 levels".
  const Status& stopped() const { return stopped_; }
  // The first key found twice in one object (DataLoss "duplicate key "k"
  // in object /tensors/x"), or OK.
  const Status& repeated() const { return repeated_; }

  // nlohmann::json's SAX interface.
  bool null();
  bool boolean(bool value);
  bool number_integer(json::number_integer_t value);
  bool number_unsigned(json::number_unsigned_t value);
  bool number_float(json::number_float_t value, const json::string_t& literal);
  bool string(json::string_t& value);
  bool binary(json::binary_t&);
  bool start_object(std::size_t);
  bool key(json::string_t& key);
  bool end_object();
  bool start_array(std::size_t);
  bool end_array();
  bool parse_error(std::size_t, const std::string& last_token,
                   const nlohmann::detail::exception& ex);

 private:
  // An open container (or, at the bottom, the document).
  struct Frame {
    enum class Type : uint8_t { kDocument, kObject, kObjects, kNamed, kNumbers, kJson };
    explicit Frame(Type type, int kind = -1, size_t count = 0)
        : type(type), kind(kind), count(count) {}
    Type type;
    int kind;          // kObject: its kind; kObjects, kNamed: their objects' kind
    int field = -1;    // kObject: the known field whose value comes next, or -1
    size_t count;      // kObject: its position in a kObjects field; kObjects,
                       // kNumbers: elements begun
    // kNamed: the name of the object being read; kObject: the key of the
    // unknown field being read.
    std::string key;
    std::unordered_set<std::string> unknown;  // kObject: keys it has no field for
  };

  bool WantsJson() const;
  bool Scalar(FieldValue value);
  bool Open(json::value_t type);
  bool OpenObject(int kind, size_t index);
  bool OpenJson(json::value_t type);
  bool AddJson(json value);
  bool CloseJson();
  bool Deliver(FieldValue value);
  bool FinishNumbers();
  bool Repeated(std::string_view key);
  bool Stop(Status status);
  std::string ObjectName() const;
  std::string Segment(const Frame& parent) const;

  std::span<const ObjectSpec> schema_;
  IndexListener* listener_;
  std::vector<Frame> stack_;
  std::vector<std::vector<FieldValue>> fields_;  // by kind
  size_t depth_ = 0;                             // open arrays and objects
  Shape numbers_;                                // the kNumbers array being read
  int64_t numbers_bad_ = -1;
  std::string numbers_bad_text_;
  // The JSON value being built (top frame kJson): its open containers,
  // outermost first, and each object's key for the value coming next.
  json json_;
  std::vector<json*> json_open_;
  std::vector<std::string> json_keys_;
  Status stopped_;
  Status repeated_;
};

}  // namespace shardsafe::internal
