// Byte-level BPE from GGUF metadata (`tokenizer.ggml.*`, model "gpt2", pre-tokenizer qwen2 or
// qwen35): special tokens, the Qwen pre-tokenizer, merges by rank, byte fallback; and a
// streaming decoder that never splits a UTF-8 character across pieces. docs/DECODER.md, "The model" (Tokenizer).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "format/gguf.h"

namespace pulse::decoder {

class Tokenizer {
public:
    enum TokenType : int32_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

    // Throws GgufError naming the key for missing or inconsistent vocab data.
    static Tokenizer load(const GgufFile& f);

    // `parse_special`: control tokens (<|im_start|> ...) in the text are read as themselves;
    // user-defined ones (<think>, <tool_call> ...) always are. No BOS unless add_bos.
    std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
    // The bytes of one token (special tokens as their text).
    std::string piece(int32_t id) const;
    std::string decode(const std::vector<int32_t>& ids) const;

    size_t size() const { return tokens_.size(); }
    int32_t eos() const { return eos_; }
    int32_t bos() const { return bos_; }
    int32_t find(std::string_view text) const;  // -1 when absent
    int32_t type(int32_t id) const { return types_[static_cast<size_t>(id)]; }
    // End of generation: eos, <|im_end|>, <|endoftext|>, <|eot_id|> when present.
    bool is_eog(int32_t id) const;
    const std::vector<int32_t>& eog_tokens() const { return eog_; }

private:
    void bpe(std::string_view piece, std::vector<int32_t>& out) const;

    std::vector<std::string> tokens_;  // as stored: byte-level unicode strings
    std::vector<int32_t> types_;
    std::unordered_map<std::string, int32_t> ids_;
    std::unordered_map<std::string, int32_t> ranks_;  // "left right" -> rank
    std::vector<int32_t> specials_;                    // control + user-defined, longest first
    std::array<bool, 256> special_starts_{};           // the first bytes of specials_ (most text bytes are not)
    std::vector<int32_t> eog_;
    int32_t eos_ = -1, bos_ = -1;
    bool add_bos_ = false;
};

// The Qwen pre-tokenizer's pieces of `text` (byte ranges into it).
std::vector<std::string_view> pretokenize_qwen(std::string_view text);

// `s` with every invalid UTF-8 sequence replaced by U+FFFD (JSON and clients need valid text;
// a model, random weights above all, can emit any byte sequence).
std::string valid_utf8(const std::string& s);

// Feeds token bytes, returns only complete UTF-8 (the rest waits for the next token); what it
// returns is always valid UTF-8.
class Utf8Stream {
public:
    std::string push(const std::string& bytes);
    std::string flush();  // whatever is left (possibly an invalid tail), at end of stream

private:
    std::string pending_;
};

}  // namespace pulse::decoder
