#include "model/tokenizer.h"

#include <unicode/uchar.h>

#include <algorithm>
#include <limits>

namespace pulse::decoder {

namespace {

// GPT-2 byte <-> printable code point table.
struct ByteTable {
    std::string enc[256];
    std::unordered_map<uint32_t, uint8_t> dec;
    ByteTable() {
        int n = 0;
        for (int b = 0; b < 256; ++b) {
            bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            uint32_t cp = printable ? static_cast<uint32_t>(b) : 0x100u + static_cast<uint32_t>(n++);
            std::string s;
            if (cp < 0x80) s += static_cast<char>(cp);
            else {
                s += static_cast<char>(0xC0 | (cp >> 6));
                s += static_cast<char>(0x80 | (cp & 0x3F));
            }
            enc[b] = s;
            dec[cp] = static_cast<uint8_t>(b);
        }
    }
};
const ByteTable& bytes() {
    static const ByteTable t;
    return t;
}

// One code point of `s` at `i`: its value (U+FFFD for invalid bytes) and its byte length.
std::pair<uint32_t, size_t> next_cp(std::string_view s, size_t i) {
    auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return {0xFFFD, 1};
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (size_t k = 1; k < len; ++k) {
        auto d = static_cast<unsigned char>(s[i + k]);
        if ((d >> 6) != 2) return {0xFFFD, 1};
        cp = (cp << 6) | (d & 0x3F);
    }
    return {cp, len};
}

enum Cls : uint8_t { kLetter = 1, kMark = 2, kNumber = 4, kSpace = 8, kNewline = 16 };

uint8_t classify(uint32_t cp) {
    uint8_t c = 0;
    if (cp == '\r' || cp == '\n') c |= kNewline;
    if (u_isUWhiteSpace(static_cast<UChar32>(cp))) c |= kSpace;
    switch (u_charType(static_cast<UChar32>(cp))) {
        case U_UPPERCASE_LETTER: case U_LOWERCASE_LETTER: case U_TITLECASE_LETTER: case U_MODIFIER_LETTER: case U_OTHER_LETTER:
            c |= kLetter;
            break;
        case U_NON_SPACING_MARK: case U_ENCLOSING_MARK: case U_COMBINING_SPACING_MARK: c |= kMark; break;
        case U_DECIMAL_DIGIT_NUMBER: case U_LETTER_NUMBER: case U_OTHER_NUMBER: c |= kNumber; break;
        default: break;
    }
    return c;
}

// The qwen2/qwen35 pre-tokenizer, alternative by alternative (see the spec's regex), over code
// points; returns the byte ranges of the pieces.
std::vector<std::string_view> pretokenize(std::string_view text) {
    std::vector<uint32_t> cps;
    std::vector<size_t> off;
    for (size_t i = 0; i < text.size();) {
        auto [cp, len] = next_cp(text, i);
        cps.push_back(cp);
        off.push_back(i);
        i += len;
    }
    off.push_back(text.size());
    const size_t n = cps.size();
    std::vector<uint8_t> cls(n);
    for (size_t i = 0; i < n; ++i) cls[i] = classify(cps[i]);
    auto is = [&](size_t i, uint8_t m) { return i < n && (cls[i] & m); };
    auto lower = [&](size_t i) { return i < n && cps[i] < 128 ? static_cast<char>(std::tolower(static_cast<int>(cps[i]))) : 0; };
    std::vector<std::string_view> out;
    size_t i = 0;
    while (i < n) {
        size_t len = 0;
        // 's 't 're 've 'm 'll 'd
        if (cps[i] == '\'') {
            char a = lower(i + 1), b = lower(i + 2);
            if (a == 's' || a == 't' || a == 'm' || a == 'd') len = 2;
            else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) len = 3;
        }
        // [^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+
        if (!len) {
            size_t j = i;
            if (!is(j, kNewline | kLetter | kNumber) && is(j + 1, kLetter | kMark)) ++j;
            if (is(j, kLetter | kMark)) {
                while (is(j, kLetter | kMark)) ++j;
                len = j - i;
            }
        }
        if (!len && is(i, kNumber)) len = 1;  // \p{N}: one digit at a time
        // " ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
        if (!len) {
            size_t j = i;
            if (cps[j] == ' ' && j + 1 < n && !is(j + 1, kSpace | kLetter | kMark | kNumber)) ++j;
            if (j < n && !is(j, kSpace | kLetter | kMark | kNumber)) {
                while (j < n && !is(j, kSpace | kLetter | kMark | kNumber)) ++j;
                while (is(j, kNewline)) ++j;
                len = j - i;
            }
        }
        if (!len && is(i, kSpace)) {
            size_t j = i;
            while (is(j, kSpace)) ++j;
            // \s*[\r\n]+ : up to the last newline in the whitespace run
            size_t last_nl = n;
            for (size_t k = i; k < j; ++k)
                if (cls[k] & kNewline) last_nl = k;
            if (last_nl != n) len = last_nl + 1 - i;
            // \s+(?!\S) : the run, leaving one space for the next piece when text follows
            else if (j == n) len = j - i;
            else if (j - i > 1) len = j - i - 1;
            else len = 1;  // \s+
        }
        if (!len) len = 1;
        out.push_back(text.substr(off[i], off[i + len] - off[i]));
        i += len;
    }
    return out;
}

}  // namespace

std::vector<std::string_view> pretokenize_qwen(std::string_view text) { return pretokenize(text); }

Tokenizer Tokenizer::load(const GgufFile& f) {
    Tokenizer t;
    std::string model = f.get_string("tokenizer.ggml.model");
    if (model != "gpt2") throw GgufError(f.name() + ": tokenizer.ggml.model is '" + model + "'; only byte-level BPE ('gpt2') is supported");
    std::string pre = f.opt_string("tokenizer.ggml.pre").value_or("default");
    if (pre != "qwen2" && pre != "qwen35")
        throw GgufError(f.name() + ": tokenizer.ggml.pre is '" + pre + "'; supported: qwen2, qwen35");
    const Value& tokens = f.get_array("tokenizer.ggml.tokens");
    if (tokens.elem != ValueType::string || tokens.items.empty()) throw GgufError(f.name() + ": tokenizer.ggml.tokens must be a non-empty string array");
    for (const auto& v : tokens.items) t.tokens_.push_back(v.s);
    t.types_.assign(t.tokens_.size(), normal);
    if (const Value* types = f.find("tokenizer.ggml.token_type")) {
        if (types->type != ValueType::array || types->items.size() != t.tokens_.size())
            throw GgufError(f.name() + ": tokenizer.ggml.token_type must have one entry per token");
        for (size_t i = 0; i < types->items.size(); ++i) t.types_[i] = static_cast<int32_t>(types->items[i].i + static_cast<int64_t>(types->items[i].u));
    }
    for (size_t i = 0; i < t.tokens_.size(); ++i) t.ids_.emplace(t.tokens_[i], static_cast<int32_t>(i));
    const Value& merges = f.get_array("tokenizer.ggml.merges");
    for (size_t r = 0; r < merges.items.size(); ++r) t.ranks_.emplace(merges.items[r].s, static_cast<int32_t>(r));
    auto id = [&](const char* key) -> int32_t {
        auto v = f.opt_uint(key);
        if (!v) return -1;
        if (*v >= t.tokens_.size()) throw GgufError(f.name() + ": " + key + " = " + std::to_string(*v) + " is outside the vocabulary");
        return static_cast<int32_t>(*v);
    };
    t.eos_ = id("tokenizer.ggml.eos_token_id");
    t.bos_ = id("tokenizer.ggml.bos_token_id");
    if (const Value* ab = f.find("tokenizer.ggml.add_bos_token")) t.add_bos_ = ab->b;
    for (size_t i = 0; i < t.tokens_.size(); ++i)
        if (t.types_[i] == control || t.types_[i] == user_defined) t.specials_.push_back(static_cast<int32_t>(i));
    std::stable_sort(t.specials_.begin(), t.specials_.end(),
                     [&](int32_t a, int32_t b) { return t.tokens_[static_cast<size_t>(a)].size() > t.tokens_[static_cast<size_t>(b)].size(); });
    for (const int32_t s : t.specials_)
        if (const std::string& text = t.tokens_[static_cast<size_t>(s)]; !text.empty()) t.special_starts_[static_cast<unsigned char>(text[0])] = true;
    if (t.eos_ >= 0) t.eog_.push_back(t.eos_);
    for (const char* s : {"<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>"})
        if (int32_t x = t.find(s); x >= 0 && std::find(t.eog_.begin(), t.eog_.end(), x) == t.eog_.end()) t.eog_.push_back(x);
    return t;
}

int32_t Tokenizer::find(std::string_view text) const {
    auto it = ids_.find(std::string(text));
    return it == ids_.end() ? -1 : it->second;
}

bool Tokenizer::is_eog(int32_t id) const { return std::find(eog_.begin(), eog_.end(), id) != eog_.end(); }

void Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
    const auto& bt = bytes();
    std::vector<std::string> sym;
    for (unsigned char c : piece) sym.push_back(bt.enc[c]);
    while (sym.size() > 1) {
        int32_t best = std::numeric_limits<int32_t>::max();
        size_t at = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
            auto it = ranks_.find(sym[i] + " " + sym[i + 1]);
            if (it != ranks_.end() && it->second < best) best = it->second, at = i;
        }
        if (best == std::numeric_limits<int32_t>::max()) break;
        sym[at] += sym[at + 1];
        sym.erase(sym.begin() + static_cast<long>(at) + 1);
    }
    for (const auto& s : sym) {
        auto it = ids_.find(s);
        if (it != ids_.end()) {
            out.push_back(it->second);
            continue;
        }
        // Not in the vocab: its bytes one by one (each byte token exists in byte-level vocabs).
        size_t i = 0;
        while (i < s.size()) {
            auto [cp, len] = next_cp(s, i);
            auto b = bt.dec.find(cp);
            if (b != bt.dec.end())
                if (auto t = ids_.find(bt.enc[b->second]); t != ids_.end()) out.push_back(t->second);
            i += len;
        }
    }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
    std::vector<int32_t> out;
    if (add_bos_ && bos_ >= 0) out.push_back(bos_);
    size_t start = 0, i = 0;
    // Each distinct piece's ids, for this text: code and prose repeat most of their pieces, and
    // a piece's merges cost a vocabulary lookup per pair per round.
    std::unordered_map<std::string_view, std::pair<size_t, size_t>> seen;  // piece -> its ids in `out` (offset, count)
    auto flush = [&](size_t end) {
        for (auto piece : pretokenize(text.substr(start, end - start))) {
            if (auto it = seen.find(piece); it != seen.end()) {
                const auto [at, n] = it->second;
                for (size_t k = 0; k < n; ++k) {
                    const int32_t id = out[at + k];  // a copy: push_back may move `out`
                    out.push_back(id);
                }
                continue;
            }
            const size_t at = out.size();
            bpe(piece, out);
            seen.emplace(piece, std::pair{at, out.size() - at});
        }
    };
    while (i < text.size()) {
        if (!special_starts_[static_cast<unsigned char>(text[i])]) {  // no special token starts here
            ++i;
            continue;
        }
        int32_t hit = -1;
        for (int32_t s : specials_) {
            if (!parse_special && types_[static_cast<size_t>(s)] == control) continue;
            const std::string& tok = tokens_[static_cast<size_t>(s)];
            if (!tok.empty() && text.compare(i, tok.size(), tok) == 0) {
                hit = s;
                break;
            }
        }
        if (hit < 0) {
            ++i;
            continue;
        }
        flush(i);
        out.push_back(hit);
        i += tokens_[static_cast<size_t>(hit)].size();
        start = i;
    }
    flush(text.size());
    return out;
}

std::string Tokenizer::piece(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) return {};
    const std::string& t = tokens_[static_cast<size_t>(id)];
    if (types_[static_cast<size_t>(id)] == control || types_[static_cast<size_t>(id)] == user_defined) return t;
    const auto& bt = bytes();
    std::string out;
    for (size_t i = 0; i < t.size();) {
        auto [cp, len] = next_cp(t, i);
        auto b = bt.dec.find(cp);
        if (b != bt.dec.end()) out += static_cast<char>(b->second);
        else out.append(t, i, len);
        i += len;
    }
    return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
    std::string s;
    for (int32_t id : ids) s += piece(id);
    return s;
}

std::string valid_utf8(const std::string& s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        auto [cp, len] = next_cp(s, i);
        bool bad = cp == 0xFFFD && !(len == 3 && s.compare(i, 3, "\xEF\xBF\xBD") == 0);
        bad = bad || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF || (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
        if (bad) out += "\xEF\xBF\xBD";
        else out.append(s, i, len);
        i += len;
    }
    return out;
}

std::string Utf8Stream::push(const std::string& b) {
    pending_ += b;
    // Keep back an incomplete trailing sequence (at most 3 bytes).
    size_t cut = pending_.size();
    for (size_t back = 1; back <= 3 && back <= pending_.size(); ++back) {
        auto c = static_cast<unsigned char>(pending_[pending_.size() - back]);
        if ((c >> 6) == 2) continue;  // continuation byte: look further back
        size_t need = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
        if (need > back) cut = pending_.size() - back;
        break;
    }
    std::string out = valid_utf8(pending_.substr(0, cut));
    pending_.erase(0, cut);
    return out;
}

std::string Utf8Stream::flush() {
    std::string out = valid_utf8(pending_);
    pending_.clear();
    return out;
}

}  // namespace pulse::decoder
