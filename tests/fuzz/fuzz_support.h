// Shared set-up for the fuzz targets: the real qwen38 plugin, loaded once.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <memory>

#include "plugin/plugin_manager.h"

namespace pulse::fuzz {

struct Profile {
    std::unique_ptr<plugin::PluginManager> pm;
    plugin::ComponentLease lease;
    void* instance = nullptr;
    rapidjson::Document model;

    static Profile& get() {
        static Profile* p = [] {
            auto* pr = new Profile();
            plugin::Options o;
            o.dirs = {PULSE_FUZZ_PLUGIN_DIR};
            pr->pm = std::make_unique<plugin::PluginManager>(o);
            pr->pm->load_all();
            pr->lease = pr->pm->translation("qwen38");
            if (!pr->lease) std::abort();
            pulse_call call;
            if (pr->lease->registration.translation.create(pr->lease->registration.user, &call, nullptr, &pr->instance) != PULSE_OK)
                std::abort();
            pr->model.Parse(R"({"id":"m","upstream_model":"m","context_window":1000,"sampling":{"temperature":0.5}})");
            return pr;
        }();
        return *p;
    }
    const pulse_translation_vt_t& vt() const { return lease->registration.translation; }
};

}  // namespace pulse::fuzz
