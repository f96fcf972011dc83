# shellcheck shell=bash
# Sourced by tools/gpu_run.sh: kernels, the step and its levers, the GPU test suites, the compile cache.
# stages_kernels STAGE runs that stage and returns its status, or 99 for a stage not in this file.
stages_kernels() {
  case $1 in
    env) nvidia-smi --query-gpu=name,memory.total,clocks.sm,driver_version --format=csv; nproc;
         python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__, torch.cuda.device_count())';;
    tests) python3 -m pytest -q -s -m gpu --timeout 300 tests 2>&1 | tee "$OUT/gpu_tests.log" | tail -40;;
    pytest)  # chosen GPU tests: PYTEST_ARGS, e.g. "tests/kernels/test_kernels_gpu.py -k attention" (~ for spaces in a chain)
      python3 -m pytest -q -m gpu --timeout 300 ${PYTEST_ARGS:?PYTEST_ARGS names the tests} 2>&1 \
        | tee "$OUT/pytest_$(date +%H%M%S).log" | tail -30;;
    tests-k) python3 -m pytest -q -m gpu tests/kernels tests/model 2>&1 | tee "$OUT/gpu_tests_k.log" | tail -30;;
    kernels)  # KERNELS_ARGS: e.g. "--sections attention --batches 1,8 --context 1024,4096,8192,32768" (one block-table
      # width for all: the longest context; llama3-8b's step section at 32k fits batch 8, not 32); KERNELS_TAG names the log;
      # KERNELS_VARIANTS: attention variants by name, ';'-separated (names hold spaces: "~" for them in a chain)
      python3 bench/kernels/step_kernels.py ${KERNELS_ARGS:-} ${KERNELS_VARIANTS:+--variants "$KERNELS_VARIANTS"} 2>&1 \
        | tee "$OUT/kernels${KERNELS_TAG:-}.log" | tail -60;;
    qkv-rope)  # issue 17: qkv with RoPE and the KV write in its epilogue (kernels/gemv_rope.py) vs the two kernels,
      # alone at decode batches (QKV_ROPE_ARGS: e.g. "--ms 8 --tiles 64x256x3,32x512x3,16x512x4")
      python3 -m bench.kernels.qkv_rope ${QKV_ROPE_ARGS:-} 2>&1 | tee "$OUT/qkv_rope_$(date +%H%M%S).log" | tail -30;;
    prefill-attn)  # issue 17: the attention kernel alone on 2k-32k-token chunks, tile variants (PREFILL_ATTN_ARGS: e.g. "--tokens 8192")
      python3 -m bench.kernels.prefill_attention ${PREFILL_ATTN_ARGS:-} 2>&1 | tee "$OUT/prefill_attn_$(date +%H%M%S).log";;  # stamped: a chain may run it twice
    prefill-ws)  # issue 17, session 27: kernels/attention_ws.py (TMA + Triton's Hopper warp specialisation; a KV tile is one
      # 64/128-token cache block): its GPU test, the kernel alone beside today's on the same keys in 16/64/128-token
      # blocks (the WS rows print their refusal since session 28), then the step bench (llama3-8b) at block 16 and 128,
      # decode rows included. PREFILL_WS_TOKENS: the step's prefill rows; PREFILL_WS_ARGS: the kernel bench's flags.
      # session 31: the specialised launch runs (BLINK_PREFILL_WS_UNCHECKED=1) and its GPU test decides whether the
      # step also runs at block 128 with the kernel (128:1): the qdev cases passed there while 2k-token steps were wrong
      python3 -m tools.diag_ws --variants qdev --shapes prompt256,chunk128@512 --stages 2,3 --timeout 40 2>&1 \
        | tee "$OUT/prefill_ws_diag.log"
      export BLINK_PREFILL_WS_UNCHECKED=1
      python3 -m pytest -q --timeout 120 -m gpu tests/kernels/test_attention_ws.py 2>&1 | tee "$OUT/prefill_ws_tests.log" | tail -8
      ws_runs="16:0:1,8,32 128:0:1,8,32"
      grep -qE "^[0-9]+ passed" "$OUT/prefill_ws_tests.log" && ! grep -q failed "$OUT/prefill_ws_tests.log" \
        && ws_runs="$ws_runs 128:1"
      python3 -m bench.kernels.prefill_attention --variants today,today-b128,ws-b128,ws-b128-s2,today-b64,ws-b64-s2 \
        ${PREFILL_WS_ARGS:-} 2>&1 | tee "$OUT/prefill_ws_kernel.log" | tail -12
      # the step compares the block sizes with today's kernel (decode at 128 takes the compiled-in page for whole
      # tiles) and, where its GPU test passed, with the WS kernel; PREFILL_WS_RUNS replaces the runs:
      for run in ${PREFILL_WS_RUNS:-$ws_runs}; do
        IFS=: read -r bs ws batches <<< "$run"
        BLINK_PREFILL_WS=$ws python3 -m blink.bench.step step --presets llama3-8b --block-size "$bs" \
          ${batches:+--batches "$batches"} $([ -n "$batches" ] || echo --no-decode) \
          --prefill-tokens "${PREFILL_WS_TOKENS:-2048,8192,32768,2048@30720}" \
          --result-json "$OUT/prefill_ws_step_b${bs}_ws${ws}.json" 2>&1 | tee "$OUT/prefill_ws_step_b${bs}_ws${ws}.log"
      done;;
    page-gather)  # issue 17, session 31: a chunk tile's table entries at once (BLINK_PAGE_GATHER, the default since
      # session 33) against one a key ("one-entry", BLINK_PAGE_GATHER=0), at 16-token blocks, beside 128-token blocks: prefill attention alone, then the step's prefill rows (llama3-8b)
      python3 -m bench.kernels.prefill_attention --variants one-entry,today,today-b128 2>&1 \
        | tee "$OUT/page_gather_kernel.log" | tail -12
      for run in 16:0 16:1 128:1; do
        IFS=: read -r bs gather <<< "$run"
        BLINK_PAGE_GATHER=$gather python3 -m blink.bench.step step --presets llama3-8b --block-size "$bs" --no-decode \
          --prefill-tokens "${PREFILL_WS_TOKENS:-2048,8192,32768,2048@30720}" \
          --result-json "$OUT/page_gather_b${bs}_g${gather}.json" 2>&1 | tee "$OUT/page_gather_b${bs}_g${gather}.log"
      done;;
    ws-diag)  # session 28: attention_ws.py's specialised kernel hung on the H200; each case in its own process under a
      # limit (tools/diag_ws.py: with and without specialisation; session 29's variants: q's descriptor made in the
      # kernel (the suspected fix), 64-row q tiles (a control), today's host descriptor; WS_DIAG_ARGS="--modes
      # load,contiguous,row" adds session 28's table modes)
      python3 -m tools.diag_ws ${WS_DIAG_ARGS:---timeout 30 --shapes prompt256,mixed} 2>&1 | tee "$OUT/ws_diag.log";;
    fusion)  # issue 17's per-layer levers: GEMV vs today's kernels per projection, the step with each lever on/off
      python3 -m bench.kernels.fusion 2>&1 | tee "$OUT/fusion.log" | tail -70;;
    graph-eager)  # issue 17: graphs vs eager (padded to the buckets, exact) under attention tunings and PDL off
      python3 -m tools.diag_graph_eager 2>&1 | grep -v Warn | tee "$OUT/graph_eager.log";;
    fusion-tests) python3 -m pytest -q -s -m gpu tests/model/test_fusion_gpu.py tests/kernels/test_kernels_gpu.py \
        2>&1 | tee "$OUT/fusion_tests.log" | tail -30;;
    fusion-step)  # the official step bench (sampling included) with the levers off, then on (FUSION_ENV; default:
      # the defaults, the GEMV at one row and PDL since 2026-12-02)
      BLINK_GEMV= BLINK_PDL=0 python3 -m blink.bench.step step --presets llama3-8b --batches 1,8,32 2>&1 \
        | tee "$OUT/fusion_step_off.log"
      env ${FUSION_ENV:-BLINK_PDL=1} python3 -m blink.bench.step step --presets llama3-8b \
        --batches 1,8,32 2>&1 | tee "$OUT/fusion_step_on.log";;
    flashinfer)  # issue 17's anchor: FlashInfer 0.5.3's decode attention and sampling beside ours
      # (bench/kernels/flashinfer_anchor.py). Needs .fi (bash tools/fetch_flashinfer.sh here; carry [".fi"], not .whl:
      # the tree and both pass 64 MiB). Its modules come prebuilt for sm_90a (flashinfer/data/aot/; fa3 with FI_FA3=1);
      # FI_ARGS adds flags.
      [ -d .fi ] || { echo "FATAL: no .fi: bash tools/fetch_flashinfer.sh, then carry .fi"; exit 1; }
      if [ ! -e /tmp/fi-site/.installed ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/fi-site .fi/*.whl \
          || exit 1
        mkdir -p /tmp/fi-aot && tar xJf .fi/aot.tar.xz -C /tmp/fi-aot || exit 1
        for so in /tmp/fi-aot/*.so; do  # flashinfer loads data/aot/<name>/<name>.so before it would compile
          dest=/tmp/fi-site/flashinfer/data/aot/$(basename "$so" .so); mkdir -p "$dest" && mv "$so" "$dest/"
        done
        touch /tmp/fi-site/.installed
      fi
      PYTHONPATH=/tmp/fi-site:$PYTHONPATH FLASHINFER_CUDA_ARCH_LIST=9.0a python3 -m bench.kernels.flashinfer_anchor \
        ${FI_ARGS:-} 2>&1 | tee "$OUT/flashinfer_anchor_$(date +%H%M%S).log" | tail -60;;
    sampling)  # issue 17: the selection rows at S = 1/8/32/128, 128 buckets per level (sampling_bucket.NUM_BUCKETS),
      # at the engine's programs per kernel (sampling_grid.programs_for), PDL as the engine takes it (one row only;
      # --pdl off,on: both), the old and new ways of session 17's levers: the race over the row or over the kept
      # tokens' list (BLINK_SAMPLER_RACE), the compaction's two reads or one (BLINK_SAMPLER_COMPACT); mismatches vs
      # the CPU reference / rows that fell back. SAMPLER_ARGS replaces it all (the old sampler: drop --no-old; every
      # scenario: drop --scenarios). Session 11: 2 columns x 4 sizes took ~150 s. Session 26: the engine's list race
      # and one read without and with 3 rounds of the rejection (BLINK_SAMPLER_REJECT, sampling_reject; 3k: top_k
      # rows too).
      python3 -m bench.kernels.sampler ${SAMPLER_ARGS:---buckets 128 --programs engine --pdl engine --race list --compact once --reject 0,3,3k --no-old --sizes 1 8 32 128 \
        --scenarios top_p,top_k,top_k+top_p,min_p,top_p_flat,top_k_flat,logprobs20,greedy} 2>&1 \
        | tee "$OUT/sampling${SAMPLER_TAG:+_$SAMPLER_TAG}.log" | tail -40
      # SAMPLER_TAG names the log (two tables in one call); SAMPLER_TESTS=0 skips the GPU tests after the table
      [ "${SAMPLER_TESTS:-1}" = 0 ] || python3 -m pytest -q -m gpu tests/kernels/test_sampling_select.py \
        tests/kernels/test_sampling.py tests/kernels/test_sampling_reject_gpu.py tests/kernels/test_sampling_floor.py \
        tests/kernels/test_sampling_searchless.py 2>&1 \
        | tee "$OUT/sampling_tests.log" | tail -10;;
    sampling-profile)  # issue 17: the sampler's per-kernel times (tools/diag_chunk.py sampler; DIAG_SAMPLER_ROWS,
      # DIAG_SAMPLER_SCENARIOS) at each rejection setting of SAMPLER_PROFILE_REJECT (BLINK_SAMPLER_REJECT's values):
      # where one round's ~20 us at 32 rows goes (session 35), and what the search costs two pending rows
      for r in ${SAMPLER_PROFILE_REJECT:-0 1 2}; do
        BLINK_SAMPLER_REJECT=$r python3 tools/diag_chunk.py sampler 2>&1 | tee "$OUT/sampling_profile_reject$r.log" \
          | tail -40
      done;;
    step-sampling)  # issue 17: llama3-8b decode rows greedy vs top_p / top_k, and prefill rows with their floors
      # (STEP_PREFILL= empty: decode rows only; STEP_ROUNDS=N: each decode row the median of N rotated rounds)
      python3 -m blink.bench.step step --presets llama3-8b --batches 1,8,32 --sampling "${STEP_SAMPLING:-greedy,top_p,top_k}" --rounds "${STEP_ROUNDS:-1}" \
        --prefill-tokens "${STEP_PREFILL-2048,8192,32768,100@2000}" --result-json "$OUT/step_sampling.json" 2>&1 | tee "$OUT/step_sampling.log";;
    diag) python3 tools/diag.py precision profile 2>&1 | tee "$OUT/diag.log";;
    fp32) python3 tools/diag.py fp32 2>&1 | grep -v Warn | tee "$OUT/fp32.log";;
    step8b) python3 -m blink.bench.step step --presets llama3-8b --batches 1,8,32 2>&1 | tee "$OUT/step8b.log";;
    precision) python3 tools/diag.py precision 2>&1 | grep -v Warn | tee "$OUT/precision.log";;
    profile) python3 tools/diag.py profile 2>&1 | grep -v Warn | tee "$OUT/profile.log";;
    prefill-profile)  # issue 17, session 33: the step's 2k-after-30k prefill kernel by kernel at 16- and 128-token blocks
      # (190 us a layer apart in the step, 52 in the attention kernel alone), then prefill attention alone over
      # consecutive blocks (a fresh server's prompt) beside the shuffled table the kernel bench uses
      python3 tools/diag_chunk.py prefill 2>&1 | grep -v Warn | tee "$OUT/prefill_profile.log"
      python3 -m bench.kernels.prefill_attention --variants one-entry,today,today-b128 --table ordered 2>&1 \
        | tee "$OUT/prefill_ordered_kernel.log" | tail -8;;
    timeline)  # issue 17: one replayed decode graph kernel by kernel (llama3-8b, TIMELINE_BATCHES, default 1): time by
      # name and a mid-step window; with PDL kernels overlap, so read a kernel's cost as completion to completion
      python3 tools/diag.py timeline 2>&1 | grep -v Warn | tee "$OUT/timeline_$(date +%H%M%S).log";;
    ncu-attn)  # issue 17: Nsight Compute on one decode attention launch (NCU_BATCH, NCU_VARIANT of step_kernels'
      # attention variants): occupancy, waves, DRAM throughput, warp stalls. Firecracker machines only (KINDS.md)
      ncu --clock-control none -k regex:_paged_attention_kernel -c 1 --section SpeedOfLight --section Occupancy \
        --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats \
        python3 bench/kernels/step_kernels.py --sections attention --batches "${NCU_BATCH:-64}" \
        --variants "${NCU_VARIANT:-default}" 2>&1 | tee "$OUT/ncu_attn_b${NCU_BATCH:-64}.log" | tail -120;;
    gemv-proj)  # issue 17: each projection alone at M = GEMV_MS rows: cuBLAS (+ the norm / SiLU kernel) vs the GEMV, GB/s
      python3 -m bench.kernels.fusion --sections gemv --ms "${GEMV_MS:-1}" --projections "${GEMV_PROJ:-all}" \
        --sweep "${GEMV_SWEEP:-all}" 2>&1 \
        | tee "$OUT/gemv_proj_$(date +%H%M%S).log" | tail -30;;
    fusion-levers)  # issue 17: the whole step with each lever, session 11's kernels vs today's side by side
      # (FUSION_CONTEXT may be a list, e.g. 1024,8192,32768; at 32k llama3-8b's KV fits batch 8, not 32)
      # FUSION_REPEATS=N: N rounds over the levers in one process, the summary a median [min-max] per lever
      python3 -m bench.kernels.fusion --sections step --batches "${FUSION_BATCHES:-1,8,32}" --levers "${LEVERS:-all}" \
        --context "${FUSION_CONTEXT:-1024}" --repeats "${FUSION_REPEATS:-1}" 2>&1 \
        | tee "$OUT/fusion_levers_$(date +%H%M%S).log" | tail -30;;
    step) python3 -m blink.bench.step step --result-json "$OUT/step.json" 2>&1 | tee "$OUT/step.log";;
    offline) python3 -m blink.bench.offline offline --result-json "$OUT/offline.json" 2>&1 | tee "$OUT/offline.log";;
    grammar-step)  # issue 15: a constrained decode step (typical schema) vs unconstrained, llama3-8b, batch 1/8/32
      python3 -m bench.grammar.constrained_step --preset llama3-8b --batches 1,8,32 --context 1024 \
        --result-json "$OUT/grammar_step.json" 2>&1 | tee "$OUT/grammar_step.log" | tail -20;;
    moe-tests)  # issue 20: Phi-4 / Qwen3-30B-A3B real shapes vs HF, MoE kernels, device == host on a tiny MoE
      python3 -m pytest -q -s -m "gpu or not gpu" --timeout 900 tests/model/test_moe_phi_gpu.py tests/kernels/test_moe.py \
        tests/kernels/test_moe_compile_sm90.py 2>&1 | tee "$OUT/moe_tests.log" | tail -30;;
    moe-kernels)  # the MoE block alone per batch: sort + grouped GEMMs, and (batch <= 8 at top-8) the streams
      python3 -m bench.kernels.moe_block ${MOE_KERNELS_ARGS:-} 2>&1 | tee "$OUT/moe_kernels.log";;
    moe-gemv)  # issue 17's MoE lever (session 27): kernels/moe_gemv.py's streams; the MoE GPU tests, the block alone at
      # batch 1-8 (sort + grouped GEMMs beside the streams), then qwen3-30b-a3b's step at batch 1 / 8 without, with
      # BLINK_MOE_GEMV=64 but the norm left apart (BLINK_MOE_NORMED=0), and with both
      python3 -m pytest -q --timeout 120 tests/kernels/test_moe_gemv.py tests/model/test_moe_phi_gpu.py -k "not hf" 2>&1 \
        | tee "$OUT/moe_gemv_tests.log" | tail -8
      python3 -m bench.kernels.moe_block --batches 1,2,4,8,16 2>&1 | tee "$OUT/moe_gemv_block.log"
      # session 29: the streams alone at batch 1 in other tiles (MOE_TILES: gate_up tiles;down tiles), since the
      # block at batch 1 read its 75 MB at ~1.7 TB/s in session 28
      python3 -m bench.kernels.moe_block --batches 1 --stream-tiles \
        "${MOE_TILES:-8x512w4s2,8x512w4s3,16x256w4s3,2x2048w4s2,4x512w4s3;2x1024w4s2,8x512w8s2,4x256w4s3,2x512w2s2}" 2>&1 \
        | tee "$OUT/moe_gemv_tiles.log"
      # session 28: the step with the streams printed nothing in 95 s (compiles or a hang?): under a limit that
      # aborts with every thread's Python stack (faulthandler), so the log says which
      for run in 64:1 0:1 64:0; do
        IFS=: read -r pairs normed <<< "$run"
        BLINK_MOE_GEMV=$pairs BLINK_MOE_NORMED=$normed PYTHONFAULTHANDLER=1 timeout -s ABRT "${MOE_STEP_LIMIT:-200}" \
          python3 -m blink.bench.step step --presets qwen3-30b-a3b \
          --batches 1,8 --result-json "$OUT/moe_gemv_step_${pairs}_$normed.json" 2>&1 \
          | tee "$OUT/moe_gemv_step_${pairs}_$normed.log"
      done;;
    moe-step) python3 -m blink.bench.step step --presets qwen3-30b-a3b,phi-4 --batches 1,8,32,128 \
        --result-json "$OUT/moe_step.json" 2>&1 | tee "$OUT/moe_step.log";;
    cache-out)  # this machine's compiled Triton kernels (cubins + metadata: enough to load them) and blink's builds
      # as one xz'd tar: put the returned gpu_cache.tar.xz into docs/results/<session>/gpu_cache/ (git keeps the
      # newest) or .gpu_cache/ (carried). xz -9e: 55 MB of cache -> 3.6 MB (gzip: 12.8), session 35.
      (cd /tmp && { find triton-cache \( -name '*.cubin' -o -name '*.json' \) -print; ls -d blink-cache 2> /dev/null; }) \
        > /tmp/cache-list
      tar cf - -C /tmp -T /tmp/cache-list | if command -v xz > /dev/null; then xz -9e -T0; else python3 -c \
        'import lzma, sys; sys.stdout.buffer.write(lzma.compress(sys.stdin.buffer.read(), preset=9 | lzma.PRESET_EXTREME))'
      fi > "$OUT/gpu_cache.tar.xz"
      echo "triton cache $(du -sh /tmp/triton-cache | cut -f1) in $(ls /tmp/triton-cache | wc -l) kernels; carried: $(du -sh "$OUT/gpu_cache.tar.xz" | cut -f1)"
      ls -la "$OUT/gpu_cache.tar.xz";;
    *) return 99;;
  esac
}
