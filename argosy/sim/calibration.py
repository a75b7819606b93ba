"""Calibration constants of the synthetic trace, each with its source.

Derived from public traces (Acme/Shanghai AI Lab NSDI'24, Helios Venus SC'21, Alibaba
DLRM NSDI'25 and GenAI 2026) and the Llama 3 report; the derivations and a comparison of
generated against source statistics are in docs/sim_trace.md. Values marked
"assumption" are our modelling choices where no public number exists.
"""

from __future__ import annotations

# Job-type mix by count, Acme Seren (acme_figs treemap_job_dist): eval 64.9, SFT 14.9,
# other 14.6, MLLM 2.9, debug 1.9, pretrain 0.9. SFT + MLLM + other -> finetune.
KIND_SHARE: dict[str, float] = {"eval": 0.649, "finetune": 0.324, "debug": 0.019, "train": 0.009}

# GPUs per job by kind, chosen so the mix reproduces the Acme Seren size bins by count
# (acme_figs cdf_job_gpunum: 1 GPU 54.0%, 2: 11.4%, 3-8: 31.3%, 9-64: 2.6%) and the
# box-plot medians (box_gpu_num: eval 1, sft 8, debug 8).
SIZE_CHOICES: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = {
    "eval": ((1, 2, 4, 8), (0.70, 0.10, 0.05, 0.15)),
    "finetune": ((1, 2, 4, 8, 16, 32, 64), (0.25, 0.20, 0.05, 0.43, 0.04, 0.02, 0.01)),
    "debug": ((1, 8, 16), (0.10, 0.80, 0.10)),
}
# Pretraining sizes: the Seren pretrain quartiles (job_type_gpu_count_approx: q1 64,
# median 128, q3 256) put a quarter of the jobs at each of 64, 128 and 256 GPUs; the top
# quarter is log-uniform over powers of two from 512 up to a cap that grows with the
# cluster (Acme max 1,024 on ~2.3k GPUs; a 100k fleet runs 1k-16k jobs,
# TRACES_OVERVIEW.md "To scale to 10k-100k GPUs"): cap = largest power of two <= N/8.
# Checked: GPU time in jobs over 256 GPUs lands in the published 44-73% (Seren 43.7,
# Kalos 75.1; job_size_gpus gpu_time share_by_bin).
PRETRAIN_QUARTILES = (64, 128, 256)
PRETRAIN_MIN_DEVICES = PRETRAIN_QUARTILES[0]
PRETRAIN_CAP_FRACTION = 1 / 8
GPU_TIME_OVER_256 = (44.0, 73.0)  # published range, percent
ELASTIC_MIN_FRACTION = 0.25  # assumption: elastic pretraining runs on 1/4..1x of its size

# Run-time quantiles (s), Acme Seren by job type (acme_figs cdf_job_duration_queue);
# p10 "<=10" read as 8 s; p99 is an assumption (3-4x p90, Philly p99/p90 ~ 22x is the
# pre-LLM bound). Finetune blends SFT (12/49/170/477/1317) with MLLM and other tails.
DURATION_QUANTILES: dict[str, dict[float, float]] = {
    "eval": {0.0: 2, 0.10: 8, 0.25: 22, 0.50: 113, 0.75: 399, 0.90: 1344, 0.99: 5400, 1.0: 14400},
    "finetune": {
        0.0: 2,
        0.10: 10,
        0.25: 40,
        0.50: 160,
        0.75: 520,
        0.90: 2500,
        0.99: 28800,
        1.0: 172800,
    },
    "debug": {0.0: 2, 0.10: 8, 0.25: 22, 0.50: 106, 0.75: 364, 0.90: 1106, 0.99: 3600, 1.0: 7200},
    # Pretrain body: Seren pretrain 48 / 296 / 1,322 / 23,398 s (p25/p50/p75/p90); the
    # tail above p90 is log-uniform up to PRETRAIN_MAX_RUN_S.
    "train": {0.0: 10, 0.10: 10, 0.25: 48, 0.50: 296, 0.75: 1322, 0.90: 23398},
}
# The longest pretraining run: Seren's longest GPU job, 1,209,604 s = 14 days
# (acme_summary max_run_time_gpu). How many pretraining runs a trace holds follows from
# the load (`generate._pretraining`): about 2% of jobs by count on a 10k-device month,
# between Seren's 0.9% and Kalos's 3.2% (job_type_mix_llm job_count_pct).
PRETRAIN_MAX_RUN_S = 1_209_604.0

# Arrivals: jobs per device per day. Seren ~1.57 (3,600/day on 2,288 GPUs), Kalos ~0.03;
# we take 0.35 (assumption between the two) so 10k devices x 30 days ~ 100k workloads.
JOBS_PER_DEVICE_DAY = 0.35
# Helios Venus hour-of-day profile: mean GPU jobs per 10 min, by hour (helios_venus).
HOURLY_PROFILE: tuple[float, ...] = (
    4.31, 3.16, 2.88, 1.85, 1.29, 0.99, 0.90, 1.08, 1.80, 3.82, 6.22, 7.08,
    5.59, 6.24, 7.49, 7.96, 8.33, 8.33, 6.16, 6.31, 6.46, 6.55, 5.52, 4.99,
)  # fmt: skip
WEEKDAY_TO_WEEKEND = 1.53  # helios_venus
# Bursts (hyper-parameter sweeps, eval fan-out): jobs arrive in batches whose size follows
# a power law on 1..MAX_BATCH (helios_venus: up to 717 GPU jobs in one 10-min bin); its
# exponent is solved per trace so the per-10-min count has the Venus CV of 1.79.
ARRIVAL_CV_10MIN = 1.79
MAX_BATCH = 717

# Inference (dlrm2025): GPU replicas per service median 15, p90 124 -> lognormal with
# mu = ln 15, sigma = ln(124/15)/1.2816. Replica peaks are scaled so inference takes
# INFER_PEAK_SHARE of the cluster at its daily peak (assumption: a serving fleet of about
# a quarter of the chips, Baige-style co-location).
INFER_REPLICA_MEDIAN = 15.0
INFER_REPLICA_P90 = 124.0
INFER_PEAK_SHARE = 0.25
INFER_SERVICES_PER_1K_DEVICES = 1.2  # assumption
# Diurnal load: mean/peak 0.36 over a day (genai2026 QPS per 10 min: api requests 0.42,
# generative requests 0.31), trough at 10% of the peak (TRACES_OVERVIEW: 3-10x; GenAI
# generative traffic swings >100x), peak at 15:00 +- 2 h per service.
INFER_MEAN_TO_PEAK = 0.36
INFER_TROUGH = 0.1
INFER_PEAK_HOUR = 15.0

PRIORITY = {"infer": 1000, "debug": 300, "eval": 200, "finetune": 100, "train": 50}
CHECKPOINT_INTERVAL_S = {"train": 1800.0, "finetune": 900.0, "eval": 0.0, "debug": 0.0}
# Alibaba openb 2023: a third of GPU tasks pin a GPU type (gpu_type_constraint_share).
PINNED_CHIP_SHARE = 0.33
