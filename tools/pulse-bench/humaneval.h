// HumanEval problems (the official JSONL or JSONL.gz format) and how a model's answer becomes a
// program to check.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace pulse::bench {

struct Problem {
    std::string task_id, prompt, entry_point, test;
};

// Throws std::runtime_error naming the file and line for unreadable or malformed input.
std::vector<Problem> load_problems(const std::filesystem::path& path);

// The chat instruction for one problem (the model answers with the whole function).
std::string chat_prompt(const Problem& p);

// The code in a chat answer: the fenced block that defines entry_point (else the first fenced
// block, else the whole text). Thinking blocks are dropped.
std::string extract_code(const std::string& answer, const std::string& entry_point);

// What HumanEval calls the completion, from a chat answer: if the code defines entry_point it
// replaces the prompt's stub (the prompt's imports stay); otherwise it continues the prompt.
// `completions` mode: the raw continuation cut at HumanEval's stop sequences.
std::string completion_from_chat(const Problem& p, const std::string& answer);
std::string completion_from_raw(const std::string& continuation);

// prompt + completion + test + check(entry_point): what the sandbox runs.
std::string program_for(const Problem& p, const std::string& completion);

}  // namespace pulse::bench
