// PEFT pattern keys compiled with PCRE2 and matched under match/depth/heap limits (pattern_key.h).
// Not the tokenizer's regex (tokenizer/regex.cpp: Oniguruma semantics, find-all).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "adapters/pattern_key.h"

#include <pcre2.h>

#include "core/error.h"
#include "core/printable.h"

namespace hearth::adapters {

namespace {
constexpr size_t kMaxKeyChars = 1000;
constexpr uint32_t kMatchLimit = 1'000'000;  // backtracking steps per module name (~10 ms)
constexpr uint32_t kDepthLimit = 1'000;
constexpr uint32_t kHeapLimitKiB = 4'096;

std::string shown(const std::string& s) { return printable(s, 120); }
}  // namespace

struct PatternKey::Code {
  pcre2_code* code = nullptr;
  pcre2_match_context* ctx = nullptr;
  ~Code() {
    pcre2_match_context_free(ctx);
    pcre2_code_free(code);
  }
};

PatternKey::PatternKey(const std::string& key, const std::string& where, const char* field)
    : code_(std::make_unique<Code>()), key_(key), where_(where), field_(field) {
  const std::string who = cat(where, ": ", field, " key '", shown(key), "'");
  HEARTH_CHECK(key.size() <= kMaxKeyChars, who, " is longer than ", kMaxKeyChars, " characters");
  // get_pattern_key: re.match(rf"(.*\.)?({key})$", module). re.match anchors at the start; `$`
  // matches at the end or before a final newline, as PCRE2's default `$` does.
  const std::string pattern = "(?:.*\\.)?(?:" + key + ")$";
  int err = 0;
  PCRE2_SIZE off = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_ANCHORED | PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
  if (!code_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw Error(cat(who, " is not a valid regular expression (", reinterpret_cast<const char*>(msg), ")"));
  }
  code_->ctx = pcre2_match_context_create(nullptr);
  HEARTH_CHECK(code_->ctx, who, ": out of memory");
  pcre2_set_match_limit(code_->ctx, kMatchLimit);
  pcre2_set_depth_limit(code_->ctx, kDepthLimit);
  pcre2_set_heap_limit(code_->ctx, kHeapLimitKiB);
}

PatternKey::~PatternKey() = default;
PatternKey::PatternKey(PatternKey&&) noexcept = default;
PatternKey& PatternKey::operator=(PatternKey&&) noexcept = default;

bool PatternKey::matches(const std::string& module) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  HEARTH_CHECK(md, where_, ": out of memory");
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(module.data()), module.size(), 0,
                             0, md, code_->ctx);
  pcre2_match_data_free(md);
  if (rc >= 0) return true;
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT || rc == PCRE2_ERROR_HEAPLIMIT)
    throw Error(cat(where_, ": ", field_, " key '", shown(key_), "' is too costly to match (catastrophic backtracking on ",
                    shown(module), "); write it without nested repetition"));
  PCRE2_UCHAR msg[256];
  pcre2_get_error_message(rc, msg, sizeof msg);
  throw Error(cat(where_, ": ", field_, " key '", shown(key_), "' cannot be matched against ", shown(module), " (",
                  reinterpret_cast<const char*>(msg), ")"));
}

}  // namespace hearth::adapters
