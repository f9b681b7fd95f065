#include "pulse-bench/humaneval.h"

#include <Poco/InflatingStream.h>
#include <rapidjson/document.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace pulse::bench {

std::vector<Problem> load_problems(const std::filesystem::path& path) {
    std::ifstream file(path, std::ios::binary);
    if (!file) throw std::runtime_error(path.string() + ": cannot read the dataset");
    std::string text;
    bool gz = path.extension() == ".gz";
    try {
        if (gz) {
            Poco::InflatingInputStream in(file, Poco::InflatingStreamBuf::STREAM_GZIP);
            text.assign(std::istreambuf_iterator<char>(in), {});
        } else {
            text.assign(std::istreambuf_iterator<char>(file), {});
        }
    } catch (const std::exception& e) {
        throw std::runtime_error(path.string() + ": not a readable gzip file (" + e.what() + ")");
    }
    std::vector<Problem> out;
    std::istringstream lines(text);
    int n = 0;
    for (std::string line; std::getline(lines, line);) {
        ++n;
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        rapidjson::Document d;
        d.Parse(line.c_str());
        auto field = [&](const char* k) {
            if (d.HasParseError() || !d.IsObject() || !d.HasMember(k) || !d[k].IsString())
                throw std::runtime_error(path.string() + ":" + std::to_string(n) + ": expected a JSON object with string '" + k + "'");
            return std::string(d[k].GetString(), d[k].GetStringLength());
        };
        out.push_back({field("task_id"), field("prompt"), field("entry_point"), field("test")});
    }
    if (out.empty()) throw std::runtime_error(path.string() + ": no problems");
    return out;
}

std::string chat_prompt(const Problem& p) {
    return "Complete the following Python function. Reply with the complete function (signature, imports it needs, "
           "and body) in one ```python code block, and nothing else.\n\n```python\n" +
           p.prompt + "```\n";
}

std::string extract_code(const std::string& answer_in, const std::string& entry_point) {
    std::string answer = answer_in;
    if (auto e = answer.find("</think>"); e != std::string::npos) answer = answer.substr(e + 8);
    std::vector<std::string> blocks;
    size_t pos = 0;
    while (true) {
        size_t open = answer.find("```", pos);
        if (open == std::string::npos) break;
        size_t nl = answer.find('\n', open);
        if (nl == std::string::npos) break;
        size_t close = answer.find("```", nl + 1);
        blocks.push_back(answer.substr(nl + 1, close == std::string::npos ? std::string::npos : close - nl - 1));
        if (close == std::string::npos) break;
        pos = close + 3;
    }
    for (const auto& b : blocks)
        if (b.find("def " + entry_point + "(") != std::string::npos) return b;
    return blocks.empty() ? answer : blocks.front();
}

std::string completion_from_chat(const Problem& p, const std::string& answer) {
    std::string code = extract_code(answer, p.entry_point);
    if (code.find("def " + p.entry_point + "(") != std::string::npos) return "\n" + code;
    return code;
}

std::string completion_from_raw(const std::string& continuation) {
    size_t cut = std::string::npos;
    for (const char* stop : {"\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"})
        cut = std::min(cut, continuation.find(stop));
    return continuation.substr(0, cut);
}

std::string program_for(const Problem& p, const std::string& completion) {
    return p.prompt + completion + "\n\n" + p.test + "\n\ncheck(" + p.entry_point + ")\n";
}

}  // namespace pulse::bench
