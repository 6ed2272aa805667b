// Columnar data files read by content through Arrow C++: Parquet (what `datasets`' to_parquet
// and the Hugging Face Hub's parquet exports write) and Arrow IPC, both the file format
// (".arrow" / Feather v2, magic "ARROW1") and the stream format (`datasets`' cache files,
// starting with the 0xFFFFFFFF continuation marker). Every row becomes one JSON object, so the
// record shapes are exactly those of JSON lines (data/dataset.hpp): a column is a key, a list
// an array, a struct an object (messages are list<struct<role, content, ...>>), a map with
// string keys an object; a null (a whole column's, or a struct field's, as pyarrow writes for
// a key some rows lack) leaves the key out, as a JSON line without it.
//
// Arrow is optional at build time (CMake RP_ARROW_DIR, which scripts/setup.sh fills from the
// pyarrow wheel): without it arrow_input_built() is false and reading throws one line saying
// how to enable it.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace rp {

enum class ColumnarFormat { none, parquet, arrow_file, arrow_stream };

/// The columnar format a file's first bytes announce ("PAR1", "ARROW1\0\0", or the IPC
/// stream's 0xFFFFFFFF continuation marker and a positive metadata length), else none.
ColumnarFormat columnar_format_of(std::string_view head);

/// "Parquet", "Arrow IPC file", "Arrow IPC stream" (for messages).
const char* columnar_format_name(ColumnarFormat f);

/// Whether this build reads columnar files (Arrow C++ was found at configure time).
bool arrow_input_built();

/// Calls record(row, n) for every row of `path` in order, n counted from 1, the row as an
/// ordered JSON object (see the file comment), reading one record batch (a Parquet row group)
/// at a time so the whole table never sits in memory. Throws std::runtime_error with one line
/// "<path>: <what>" for a damaged or unreadable file, a column type with no JSON counterpart
/// (binary, dates, decimals: "<path>: column \"x\": Arrow type ... (expected strings, numbers,
/// booleans, lists, structs or string-keyed maps)"), or when this build has no Arrow; whatever
/// `record` throws passes through.
void for_each_columnar_row(const std::string& path, ColumnarFormat format,
                           const std::function<void(const nlohmann::ordered_json& row, size_t n)>& record);

}  // namespace rp
