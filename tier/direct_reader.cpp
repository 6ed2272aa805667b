#include "tier/direct_reader.hpp"

#include <fcntl.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include <fmt/format.h>

#include "base/checksum.hpp"
#include "base/error_text.hpp"

namespace rp::tier {

ReadFault fail_nth_read(uint64_t n, int err) {
  return [n, err](uint64_t i, uint64_t, size_t) { return i == n ? err : 0; };
}

DirectReader::DirectReader(std::shared_ptr<const CacheFile> file, DirectReaderOptions options)
    : file_(std::move(file)), opt_(std::move(options)) {
  if (!file_) throw std::invalid_argument("direct reader: no cache file");
  if (opt_.max_io_bytes < kDirectAlign || opt_.max_io_bytes % kDirectAlign != 0 ||
      opt_.max_io_bytes > (1u << 30))
    throw std::invalid_argument(
        fmt::format("{}: direct reader: max_io_bytes {}, expected a multiple of {} up to 1 GiB",
                    file_->path(), opt_.max_io_bytes, kDirectAlign));
  direct_ = opt_.direct && file_->direct_fd() >= 0;
  fd_ = direct_ ? file_->direct_fd() : file_->fd();
  engine_ = make_io_engine(opt_.engine, opt_.queue_depth, opt_.pread_threads, &fallback_reason_);
  engine_name_ = engine_->name();
}

DirectReader::~DirectReader() { shutdown(); }

uint64_t DirectReader::submit(const ReadRequest& q) {
  if (stopped_)
    throw std::logic_error(fmt::format("{}: direct reader: submit after shutdown", file_->path()));
  const CacheEntry& e = file_->entry(q.entry);
  auto bad = [&](const std::string& what) {
    return std::invalid_argument(
        fmt::format("{}: read of entry '{}': {}", file_->path(), excerpt(e.name), what));
  };
  if (q.offset % kDirectAlign != 0 || q.offset > e.bytes)
    throw bad(fmt::format("offset {} is not a multiple of {} within its {} bytes", q.offset, kDirectAlign,
                          e.bytes));
  const uint64_t bytes = q.bytes == kToEntryEnd ? e.bytes - q.offset : q.bytes;
  if (bytes > e.bytes - q.offset)
    throw bad(fmt::format("{} bytes at offset {} run past its {} bytes", bytes, q.offset, e.bytes));
  if (reinterpret_cast<uintptr_t>(q.dst) % kDirectAlign != 0 || (bytes > 0 && !q.dst))
    throw bad(fmt::format("the buffer {} is not {}-aligned", static_cast<void*>(q.dst), kDirectAlign));
  if (q.capacity < align_up(bytes))
    throw bad(fmt::format("a buffer of {} bytes, the read needs {} (padded to {})", q.capacity,
                          align_up(bytes), kDirectAlign));
  Request r;
  r.req = q;
  r.req.bytes = bytes;
  r.ticket = next_ticket_++;
  r.file_offset = e.offset + q.offset;
  r.length = align_up(bytes);
  requests_.push_back(std::move(r));
  pump();
  return requests_.back().ticket;
}

void DirectReader::pump() {
  for (auto& r : requests_) {
    while (r.error_code == 0 && r.started < r.length) {
      if (engine_->in_flight() >= engine_->depth()) return;
      const size_t n = size_t(std::min<uint64_t>(opt_.max_io_bytes, r.length - r.started));
      const uint64_t at = r.file_offset + r.started;
      const uint64_t index = reads_started_++;
      if (const int err = opt_.fault ? opt_.fault(index, at, n) : 0; err != 0) {
        fail(r, err, fmt::format("read of {} bytes at file offset {} failed: {}", n, at, std::strerror(err)));
        break;
      }
      const uint64_t id = next_piece_++;
      pieces_[id] = {r.ticket, r.started, n};
      engine_->submit({id, fd_, r.req.dst + r.started, n, at});
      r.started += n;
      ++r.in_flight;
    }
  }
}

void DirectReader::fail(Request& r, int code, std::string what) {
  if (r.error_code != 0) return;  // the first failure is the one reported
  const CacheEntry& e = file_->entry(r.req.entry);
  r.error_code = code;
  r.error = fmt::format("{}: entry '{}' at offset {}: {}", file_->path(), excerpt(e.name), e.offset, what);
}

void DirectReader::complete(const IoCompletion& c) {
  const auto it = pieces_.find(c.id);
  if (it == pieces_.end()) throw std::logic_error("direct reader: a completion for no read");
  const Piece p = it->second;
  pieces_.erase(it);
  Request& r = request(p.ticket);
  --r.in_flight;
  const uint64_t at = r.file_offset + p.offset;
  if (c.result < 0) {
    fail(r, int(-c.result),
         fmt::format("read of {} bytes at file offset {} failed: {}", p.bytes, at,
                     std::strerror(int(-c.result))));
  } else if (uint64_t(c.result) < p.bytes) {
    // regular files read short only at their end: the file shrank after it was opened
    fail(
        r, ENODATA,
        fmt::format("short read: {} of {} bytes at file offset {} (the file is shorter than its header says: "
                    "truncated after it was opened?)",
                    c.result, p.bytes, at));
  } else {
    r.done += p.bytes;
  }
  if (!direct_) ::posix_fadvise(fd_, off_t(at), off_t(p.bytes), POSIX_FADV_DONTNEED);
}

ReadResult DirectReader::pop_front() {
  Request r = std::move(requests_.front());
  requests_.pop_front();
  const CacheEntry& e = file_->entry(r.req.entry);
  ReadResult out{r.ticket,  r.req.tag, r.req.entry,  r.req.offset,      r.req.bytes,
                 r.req.dst, false,     r.error_code, std::move(r.error)};
  if (!out.ok() || !opt_.verify) return out;
  if (r.req.offset == 0 && r.req.bytes == e.bytes) {
    if (const uint64_t got = checksum64(r.req.dst, e.bytes); got != e.checksum) {
      out.error_code = EBADMSG;
      out.error = file_->checksum_mismatch(r.req.entry, got);
    } else {
      out.verified = true;
    }
  } else if (const uint64_t block = file_->checksum_block_bytes();
             r.req.offset % block == 0 &&
             ((r.req.offset + r.req.bytes) % block == 0 || r.req.offset + r.req.bytes == e.bytes)) {
    out.error = file_->check_blocks(r.req.entry, r.req.offset, r.req.dst, r.req.bytes);
    out.error_code = out.error.empty() ? 0 : EBADMSG;
    out.verified = out.error.empty();
  }
  return out;
}

std::optional<ReadResult> DirectReader::next() {
  for (;;) {
    if (requests_.empty()) return std::nullopt;
    pump();
    if (requests_.front().finished()) return pop_front();
    if (engine_->in_flight() == 0)
      throw std::logic_error(
          fmt::format("{}: direct reader: the oldest request waits on no read", file_->path()));
    complete(engine_->wait());
  }
}

std::optional<ReadResult> DirectReader::try_next() {
  if (requests_.empty()) return std::nullopt;
  while (auto c = engine_->poll()) complete(*c);
  pump();
  if (requests_.front().finished()) return pop_front();
  return std::nullopt;
}

void DirectReader::shutdown() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& r : requests_) r.started = r.length;  // start nothing more
  if (engine_) {
    try {
      while (engine_->in_flight() > 0) engine_->wait();  // the kernel may still write into the buffers
    } catch (const std::exception&) {
      // the engine's destructor waits for what is left
    }
    engine_.reset();
  }
  requests_.clear();
  pieces_.clear();
}

}  // namespace rp::tier
