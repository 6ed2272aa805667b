// Parquet / Arrow IPC rows as JSON records (data/arrow_records.hpp). Compiled with
// RP_HAVE_ARROW=1 and Arrow's headers only when CMake found Arrow C++ (RP_ARROW_DIR).
#include "data/arrow_records.hpp"

#include <cctype>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "base/error_text.hpp"

#if RP_HAVE_ARROW
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/ipc/reader.h>
#include <parquet/arrow/reader.h>
#include <parquet/exception.h>
#endif

namespace rp {

ColumnarFormat columnar_format_of(std::string_view head) {
  if (head.size() >= 4 && head.substr(0, 4) == "PAR1") return ColumnarFormat::parquet;
  if (head.size() >= 8 && head.substr(0, 8) == std::string_view("ARROW1\0\0", 8))
    return ColumnarFormat::arrow_file;
  if (head.size() >= 8 && head.substr(0, 4) == "\xFF\xFF\xFF\xFF") {
    int32_t len = 0;  // the schema message's length, little-endian
    std::memcpy(&len, head.data() + 4, 4);
    if (len > 0) return ColumnarFormat::arrow_stream;
  }
  return ColumnarFormat::none;
}

const char* columnar_format_name(ColumnarFormat f) {
  switch (f) {
    case ColumnarFormat::parquet: return "Parquet";
    case ColumnarFormat::arrow_file: return "Arrow IPC file";
    case ColumnarFormat::arrow_stream: return "Arrow IPC stream";
    case ColumnarFormat::none: break;
  }
  return "not a columnar";
}

#if !RP_HAVE_ARROW

bool arrow_input_built() { return false; }

void for_each_columnar_row(const std::string& path, ColumnarFormat format,
                           const std::function<void(const nlohmann::ordered_json&, size_t)>&) {
  throw std::runtime_error(one_line(fmt::format(
      "{}: a {} file, and this roundpipe was built without Arrow C++: run scripts/setup.sh (it unpacks "
      "pyarrow's libarrow/libparquet into .deps/pyarrow) and rebuild, or configure with "
      "-DRP_ARROW_DIR=<folder with include/arrow and lib/libarrow.so.N>",
      path, columnar_format_name(format))));
}

#else

namespace {
using Json = nlohmann::ordered_json;

[[noreturn]] void fail(const std::string& path, std::string what) {
  // Arrow's reasons may end in a newline (Parquet's thrift errors): the line ends with the reason
  while (!what.empty() && std::isspace(static_cast<unsigned char>(what.back()))) what.pop_back();
  throw std::runtime_error(one_line(fmt::format("{}: {}", path, what)));
}

void check(const std::string& path, const arrow::Status& st) {
  if (!st.ok()) fail(path, st.message());
}

template <typename T>
T value_or_fail(const std::string& path, arrow::Result<T> r) {
  if (!r.ok()) fail(path, r.status().message());
  return std::move(r).ValueOrDie();
}

/// Whether values of `t` have a JSON counterpart (strings, numbers, booleans, null, and lists,
/// structs, string-keyed maps and dictionaries of those).
bool json_like(const arrow::DataType& t) {
  using arrow::Type;
  switch (t.id()) {
    case Type::NA:
    case Type::BOOL:
    case Type::STRING:
    case Type::LARGE_STRING:
    case Type::STRING_VIEW:
    case Type::INT8:
    case Type::INT16:
    case Type::INT32:
    case Type::INT64:
    case Type::UINT8:
    case Type::UINT16:
    case Type::UINT32:
    case Type::UINT64:
    case Type::FLOAT:
    case Type::DOUBLE: return true;
    case Type::LIST:
    case Type::LARGE_LIST:
    case Type::FIXED_SIZE_LIST: return json_like(*t.field(0)->type());
    case Type::STRUCT:
      for (const auto& f : t.fields())
        if (!json_like(*f->type())) return false;
      return true;
    case Type::MAP: {
      const auto& m = static_cast<const arrow::MapType&>(t);
      const auto k = m.key_type()->id();
      return (k == Type::STRING || k == Type::LARGE_STRING) && json_like(*m.item_type());
    }
    case Type::DICTIONARY: return json_like(*static_cast<const arrow::DictionaryType&>(t).value_type());
    default: return false;
  }
}

Json value_at(const arrow::Array& a, int64_t i);

template <typename ListArrayT>
Json list_at(const arrow::Array& a, int64_t i) {
  const auto& l = static_cast<const ListArrayT&>(a);
  Json out = Json::array();
  const auto& values = *l.values();
  for (int64_t k = l.value_offset(i), end = k + l.value_length(i); k < end; ++k)
    out.push_back(value_at(values, k));
  return out;
}

Json struct_at(const arrow::StructArray& s, int64_t i) {
  Json out = Json::object();
  for (int f = 0; f < s.num_fields(); ++f) {
    const auto& field = *s.field(f);
    if (field.IsNull(i)) continue;  // a key this row lacks, as a JSON object without it
    out[s.struct_type()->field(f)->name()] = value_at(field, i);
  }
  return out;
}

Json map_at(const arrow::MapArray& m, int64_t i) {
  Json out = Json::object();
  for (int64_t k = m.value_offset(i), end = k + m.value_length(i); k < end; ++k) {
    const Json key = value_at(*m.keys(), k);
    if (key.is_string()) out[key.get<std::string>()] = value_at(*m.items(), k);
  }
  return out;
}

template <typename ArrayT>
auto number_at(const arrow::Array& a, int64_t i) {
  return static_cast<const ArrayT&>(a).Value(i);
}

/// Row i of `a` (whose type is json_like) as JSON.
Json value_at(const arrow::Array& a, int64_t i) {
  using arrow::Type;
  if (a.IsNull(i)) return nullptr;
  switch (a.type_id()) {
    case Type::BOOL: return number_at<arrow::BooleanArray>(a, i);
    case Type::STRING: return std::string(static_cast<const arrow::StringArray&>(a).GetView(i));
    case Type::LARGE_STRING: return std::string(static_cast<const arrow::LargeStringArray&>(a).GetView(i));
    case Type::STRING_VIEW: return std::string(static_cast<const arrow::StringViewArray&>(a).GetView(i));
    case Type::INT8: return number_at<arrow::Int8Array>(a, i);
    case Type::INT16: return number_at<arrow::Int16Array>(a, i);
    case Type::INT32: return number_at<arrow::Int32Array>(a, i);
    case Type::INT64: return number_at<arrow::Int64Array>(a, i);
    case Type::UINT8: return number_at<arrow::UInt8Array>(a, i);
    case Type::UINT16: return number_at<arrow::UInt16Array>(a, i);
    case Type::UINT32: return number_at<arrow::UInt32Array>(a, i);
    case Type::UINT64: return number_at<arrow::UInt64Array>(a, i);
    case Type::FLOAT: return number_at<arrow::FloatArray>(a, i);
    case Type::DOUBLE: return number_at<arrow::DoubleArray>(a, i);
    case Type::LIST: return list_at<arrow::ListArray>(a, i);
    case Type::LARGE_LIST: return list_at<arrow::LargeListArray>(a, i);
    case Type::FIXED_SIZE_LIST: return list_at<arrow::FixedSizeListArray>(a, i);
    case Type::STRUCT: return struct_at(static_cast<const arrow::StructArray&>(a), i);
    case Type::MAP: return map_at(static_cast<const arrow::MapArray&>(a), i);
    case Type::DICTIONARY: {
      const auto& d = static_cast<const arrow::DictionaryArray&>(a);
      return value_at(*d.dictionary(), d.GetValueIndex(i));
    }
    default: return nullptr;  // unreachable for json_like types
  }
}

/// The rows of one record batch through `record`; `n` counts rows over the whole file.
void rows_of(const std::string& path, const arrow::RecordBatch& batch, size_t& n,
             const std::function<void(const Json&, size_t)>& record) {
  check(path, batch.ValidateFull());  // an IPC file is not checked as it is read
  const auto& schema = *batch.schema();
  for (int c = 0; c < batch.num_columns(); ++c)
    if (!json_like(*schema.field(c)->type()))
      fail(path,
           fmt::format("column \"{}\": Arrow type {} has no JSON counterpart (expected strings, numbers, "
                       "booleans, lists, structs or string-keyed maps)",
                       excerpt(schema.field(c)->name()), excerpt(schema.field(c)->type()->ToString())));
  for (int64_t r = 0; r < batch.num_rows(); ++r) {
    Json row = Json::object();
    for (int c = 0; c < batch.num_columns(); ++c) {
      const auto& col = *batch.column(c);
      if (!col.IsNull(r)) row[schema.field(c)->name()] = value_at(col, r);
    }
    record(row, ++n);
  }
}

void read_batches(const std::string& path, arrow::RecordBatchReader& reader,
                  const std::function<void(const Json&, size_t)>& record) {
  size_t n = 0;
  for (;;) {
    std::shared_ptr<arrow::RecordBatch> batch;
    check(path, reader.ReadNext(&batch));
    if (!batch) break;
    rows_of(path, *batch, n, record);
  }
}

void read_file(const std::string& path, ColumnarFormat format,
               const std::function<void(const Json&, size_t)>& record) {
  auto file = value_or_fail(path, arrow::io::ReadableFile::Open(path));
  switch (format) {
    case ColumnarFormat::parquet: {
      auto reader = value_or_fail(path, parquet::arrow::OpenFile(file, arrow::default_memory_pool()));
      auto batches = value_or_fail(path, reader->GetRecordBatchReader());
      read_batches(path, *batches, record);
      break;
    }
    case ColumnarFormat::arrow_file: {
      auto reader = value_or_fail(path, arrow::ipc::RecordBatchFileReader::Open(file));
      size_t n = 0;
      for (int b = 0; b < reader->num_record_batches(); ++b)
        rows_of(path, *value_or_fail(path, reader->ReadRecordBatch(b)), n, record);
      break;
    }
    case ColumnarFormat::arrow_stream: {
      auto reader = value_or_fail(path, arrow::ipc::RecordBatchStreamReader::Open(file));
      read_batches(path, *reader, record);
      break;
    }
    case ColumnarFormat::none: fail(path, "not a Parquet or Arrow IPC file");
  }
}
}  // namespace

bool arrow_input_built() { return true; }

void for_each_columnar_row(const std::string& path, ColumnarFormat format,
                           const std::function<void(const Json&, size_t)>& record) {
  try {
    read_file(path, format, record);
  } catch (const parquet::ParquetException& e) {  // a damaged footer or page
    fail(path, fmt::format("damaged {} file: {}", columnar_format_name(format), e.what()));
  }
}

#endif

}  // namespace rp
