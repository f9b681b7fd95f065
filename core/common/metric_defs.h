// The metrics that the shipped alerting rules and dashboard rely on (config/prometheus,
// config/grafana), each defined once: their call sites, and the zero series the gateway seeds at
// start (seed_alert_series), name them from here. A counter that first appears at 1 shows no
// increase() to Prometheus, so an alert on the first failure would never fire without the seed.
#pragma once

namespace pulse::metrics {

struct Def {
    const char* name;
    const char* help;
};

inline constexpr Def kRequests{"pulse_requests_total", "Responses requests by model, endpoint and outcome"};
inline constexpr Def kTtft{"pulse_ttft_seconds", "receipt to first backend output"};
inline constexpr Def kFailovers{"pulse_failovers_total", "requests moved to the next endpoint before any output"};
inline constexpr Def kRetries{"pulse_retries_total", "request rounds started again after every endpoint failed"};
inline constexpr Def kResumed{"pulse_resumed_streams_total", "responses continued on another endpoint after their backend failed mid-stream"};
inline constexpr Def kCapacityRejections{"pulse_capacity_rejections_total", "requests refused because max_streams were in flight"};
inline constexpr Def kPolicyDecisions{"pulse_policy_decisions_total",
                                      "request policy calls by outcome (applied, unchanged, timeout, error, invalid, busy)"};
inline constexpr Def kConfigReloadFailures{"pulse_config_reload_failures_total", "configuration reloads refused"};
inline constexpr Def kPluginReloadFailures{"pulse_plugin_reload_failures_total", "plugin reloads refused or failed; the old version keeps serving"};
inline constexpr Def kEndpointUp{"pulse_endpoint_up", "1 while the gateway counts the endpoint healthy, else 0 (set at each scrape)"};
inline constexpr Def kEndpointInFlight{"pulse_endpoint_in_flight", "requests the endpoint is serving now (set at each scrape)"};

}  // namespace pulse::metrics
