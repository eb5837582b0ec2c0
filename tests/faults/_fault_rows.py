"""The rows of the fault matrix in docs/reliability.md: one entry per fault the suite injects.

Each test of the suite carries ``@pytest.mark.fault_row("<id>")``; the table's count column
is the number of such tests (checked by ``test_reliability_doc.py``), and
``scripts/reliability_table.py`` renders the table from this file and a run's results.
"""

from __future__ import annotations

ROWS: dict[str, tuple[str, str, str]] = {
    # id: (fault, how it is injected, what must hold)
    "api-create": (
        "API 503s, a timeout, a response lost after the server acted: deployment create",
        "local control plane fails (503 unavailable), delays past the client timeout, or acts and drops the connection on POST /deployments",
        "create returns; exactly one deployment with that name exists",
    ),
    "api-trigger": (
        "API 503s, a timeout, a response lost after the server acted: hot-load trigger",
        "the same three faults on POST /hotLoads during HotLoader.publish",
        "publish completes; exactly one hot-load of that identity exists",
    ),
    "api-wait": (
        "API 503s, timeouts and dropped answers while waiting",
        "faults on GET /hotLoads/{id} and its replicas while HotLoader.wait polls",
        "the wait survives and returns COMPLETED with every replica on the identity",
    ),
    "s3-drop": (
        "connection drops mid-upload",
        "the loopback S3 proxy cuts upload connections after K bytes",
        "publish completes; stored objects equal the local bytes; every replica serves them",
    ),
    "kill-publisher": (
        "trainer killed (kill -9) mid-publish",
        "SIGKILL of a publisher subprocess (upload_snapshot, 5 MiB parts) while its multipart upload runs",
        "no index (snapshot invisible); a rerun completes with identical objects, re-sending only unfinished parts",
    ),
    "race": (
        "concurrent publishers, same identity, different bytes",
        "two processes publish different snapshots under one identity at once",
        "exactly one wins; the other gets SnapshotConflictError; the stored snapshot is entirely the winner's",
    ),
    "resume-race": (
        "a killed publisher resumed after a rival stored other bytes under its identity",
        "SIGKILL of a publisher process when a chosen request of its multipart upload arrives (after the create, "
        "after two parts, before and after the completion); a second publisher with other bytes (the same first "
        "parts) under the identity; the first one re-run. Also objects whose bytes are not their cwtrain-sha256 "
        "(an earlier writer's) or were stored in other parts",
        "every stored object holds the bytes its cwtrain-sha256 names; exactly one publisher succeeds and the whole "
        "snapshot is its own, the other gets SnapshotConflictError; an object whose bytes are not its record is "
        "refused (SnapshotChecksumError, no index); no unfinished multipart upload is left",
    ),
    "store-deadline": (
        "an object store that never answers, or stops answering mid-upload",
        "a loopback server that accepts connections and never answers (upload_snapshot with a 2 s budget; "
        "`cwtrain hotload publish --timeout 5` as a process); the proxy holding the second part of a multipart upload",
        "the publish ends at its deadline (5 s plus at most one poll interval for the CLI, process start included) "
        "with one error line saying no hot-load was created, exit 1; what was stored stays and a re-run resumes it",
    ),
    "late-create": (
        "a hot-load create answered after the publish's budget ran out",
        "the local control plane delays POST /hotLoads past `hotload publish --timeout 3`; the API stand-in answers "
        "a create late, or becomes READY only after the budget of a readiness wait ran out",
        "a create that went out is followed to its end (the publish reports the hot-load COMPLETED, exit 0, and "
        "says it ran past its budget); no create is sent once the budget is spent; a wait that times out says the "
        "hot-load may still go live",
    ),
    "sigterm": (
        "SIGTERM (how Kubernetes stops a pod) or Ctrl-C during a publish or a diff",
        "a real SIGTERM or SIGINT to `cwtrain hotload publish` while a part of its multipart upload is held by the "
        "proxy, to a publish waiting for its hot-load, and to `cwtrain snapshot diff` once its staged output exists",
        "exit 143 (SIGTERM) or 130 (SIGINT) with one error line; no index, no unfinished multipart upload, a line "
        "saying what stays stored; a hot-load being waited for is named as still running; no hidden partial "
        "directory is left",
    ),
    "flip-delta": (
        "a flipped byte in a stored delta",
        "one byte of an uploaded delta shard inverted before the hot-load",
        "hot-load FAILED with a reason; replicas keep serving the previous identity; the next (FULL) publish recovers",
    ),
    "flip-full": (
        "a flipped byte in a stored FULL snapshot",
        "one byte of an uploaded FULL shard's tensor data inverted before the hot-load",
        "hot-load FAILED with a reason; replicas keep serving the previous identity; a re-published FULL recovers",
    ),
    "flip-full-object": (
        "a flipped byte in a stored plain FULL snapshot (no Adler-32s)",
        "one byte of an uploaded checkpoint's tensor data inverted, its cwtrain-sha256 metadata kept, then the hot-load triggered",
        "replicas refuse it naming the object (FAILED) and keep serving the previous identity; `hotload trigger` refuses it before creating a hot-load unless --no-verify",
    ),
    "error-recovery": (
        "a corrupt delta in the chain a restarted replica must replay",
        "one byte of a served delta inverted, then the deployment's only replica killed: it restarts cold and cannot catch up",
        "STATUS_ERROR whose reason names the replica and the object; a rollback to the intact FULL, or `cwtrain "
        "hotload publish` of a fresh FULL (no delete, no manual rollback), is accepted and brings READY back, "
        "serving that FULL's bytes",
    ),
    "replica-killed": (
        "a replica killed during a hot-load",
        "SIGKILL of one replica right after the hot-load reached it",
        "the hot-load ends (COMPLETED, or FAILED with a reason); the restarted replica serves the same bytes as its peer",
    ),
    "cold-replica": (
        "a cold replica joining after 30 deltas",
        "a single-replica deployment's replica killed after FULL + 30 deltas (no peer: it replays the chain)",
        "it serves the trainer's exact weights (log-probs equal to the trainer's)",
    ),
    "replica-load-fails": (
        "one of two replicas fails to load a hot-load",
        "the local stack's replica fault `fail_load`, at one chosen version of a run",
        "hot-load FAILED naming the replica and its reason; the peer keeps the new identity (a mix, both routed); "
        "a later hot-load (re-activation) brings both onto one identity",
    ),
    "replica-stays-behind": (
        "a replica reports success but keeps the old identity",
        "the local stack's replica fault `stay_behind` on the next hot-load",
        "hot-load COMPLETED, yet the publish fails (the fleet is split) naming the replica and the identity it "
        "serves; its replica row names the old identity and verification refuses it; a re-activation brings the "
        "replica onto the new identity",
    ),
    "fleet-convergence": (
        "a replica fails to load, stays behind, or serves wrong weights at a random version of a 20-version run",
        "one of the replica faults above at a version drawn at random; the run publishes through PublishSession "
        "(on_failure=reactivate, verify and the canary on)",
        "the publish reports failed and reactivated; every replica serves one identity within the budget; a fresh "
        "batch holds no sample of the failed identity; the next version is FULL and the run reaches its last; "
        "with on_failure=stop the publish raises as before",
    ),
    "ahead-failure": (
        "a replica fails to load, or serves wrong weights, while the trainer trains one step ahead",
        "fail_load or serve_wrong_weights(corrupt) on one replica at a version drawn at random of a run published "
        "through PublishAhead (on_failure=reactivate, verify and the canary on; the sampler fenced at 1)",
        "the failed version is answered as in sync mode (failed, reactivated, the next version FULL, the run reaches "
        "its last); no batch trained on holds a sample of the failed identity or one more than 1 version behind "
        "the trainer's weights",
    ),
    "fence-two-sided": (
        "a fleet serving a version the trainer did not publish as served (newer than the newest published, or "
        "burned), or a split group whose answers only partly name an identity",
        "scripted completions endpoints answer from a version above the newest published "
        "(CWTRAIN_ROLLOUT_MAX_STALENESS=0), from a version noted burned (within the limit, for good, and burned "
        "while the batch runs), or a split group where some answers name no identity",
        "those completions are re-requested, counted in coreweave/unpublished_rerequested, never returned; a "
        "half-unnamed group is re-sampled whole (mixed_groups_resampled); a group naming no identity is kept and "
        "counted (samples_without_version), asked once; a fleet that stays so fails the batch within max_attempts "
        "with a RolloutError naming the identity",
    ),
    "trainer-restart": (
        "a trainer restarted with the same run id",
        "a new publish session (a custom loop, slime's hook and its baseline, miles' post-save hook, NeMo-RL's "
        "synchronizer) after the run published versions, on the local stack and the API stand-in; also after a "
        "failed attempt that stored objects without a hot-load, and an upload a killed process left unfinished",
        "the restart publishes the version after the last one any process attempted, FULL, and it completes "
        "(no SnapshotConflictError); its own count is moved on past it; deltas follow; its baseline never rolls "
        "the fleet back from a later version of the run unless CWTRAIN_HOTLOAD_ROLLBACK_ON_RESUME asks",
    ),
    "wrong-weights": (
        "a replica serves a corrupted or an old FULL under the new identity",
        "the local stack's replica fault `serve_wrong_weights` (corrupt: lm_head's exponent and mantissa bits "
        "inverted; previous: the weights it served before)",
        "the canary's gap exceeds its bound on that replica's answers and the check fails; on correct weights it "
        "passes",
    ),
    "defaults-converge": (
        "a replica reports the hot-load done but keeps the old identity, with the default settings",
        "the local stack's replica fault `stay_behind` on a run's second version; PublishSession with the "
        "integrations' defaults (CWTRAIN_HOTLOAD_VERIFY off), and each publisher (slime's hook and live tensors, "
        "miles, NeMo-RL, the demo)",
        "the version fails (converged 0, the error says the fleet is split) and goes through on_failure: every "
        "replica is brought back to the version before; the next version is FULL and every replica serves it",
    ),
    "way-back-checked": (
        "a corrupt shard inside the served chain, then a failed hot-load",
        "one byte of a delta shard of the chain inverted (its cwtrain-sha256 kept), then the replica fault "
        "`fail_load` on the next version; then the chain's FULL and the newer FULL corrupted too; the same in each "
        "publisher (slime's hook and live tensors, miles, NeMo-RL, the demo)",
        "the re-activation passes over every identity whose chain holds the corrupt shard and brings every replica "
        "back to the intact FULL; with none intact the run stops with one error naming each candidate and what "
        "cannot be replayed",
    ),
    "canary-record": (
        "the canary's endpoint stops answering after a hot-load completed on every replica",
        "a loopback endpoint that accepts connections and never answers, as the canary's base_url, with "
        "on_failure=stop",
        "the publish fails naming the canary; the session's served identity, the served-identity file and the "
        "next plan (FULL) name the identity every replica serves",
    ),
    "publish-budget": (
        "a canary that never answers, with its defaults (600 s per request, 6 attempts)",
        "the silent endpoint as the canary's base_url; a publish with a 6 s timeout and on_failure=reactivate",
        "the canary's failure is answered by a re-activation and the publish returns within its timeout plus one "
        "poll; every replica serves the version before",
    ),
    "sample-canary": (
        "a replica serves corrupted or previous weights under the new identity, with no probe canary",
        "the local stack's replica fault `serve_wrong_weights` (corrupt, then previous); a batch sampled at "
        "temperature 1 judged from the sampled tokens' served and trainer log-probs (judge_samples), then "
        "PublishSession.refuse",
        "correct weights pass and both wrong ones exceed the bound; the late refusal brings every replica back to "
        "the version before, reports failed, reactivated and the gap, burns the version, and the next one is FULL",
    ),
    "framework-canary": (
        "a replica serves corrupted or previous weights under the new identity, in a framework's own run",
        "the local stack's replica fault `serve_wrong_weights` (corrupt, then previous) under each framework's "
        "entry points with their defaults; the batch judged where the framework compares its trainer's log-probs "
        "with the served ones (NeMo-RL: grpo's log-prob masking step; slime hook, slime live tensors and miles: "
        "log_rollout_data, wrapped by init_hook)",
        "correct weights pass and both wrong ones exceed the bound (hotload/canary_gap); the refused version is "
        "answered as a failed hot-load: every replica back on a version the trainer published, its samples out "
        "of the batch, the next version FULL",
    ),
    "session-ownership": (
        "a trainer that shares its API client with the publish session",
        "PublishSession given a Target built on the trainer's client, closed after a publish; one built from "
        "the settings, closed",
        "the trainer's client keeps working; a session closes only the client it built",
    ),
    "torn-upload": (
        "a shard rewritten in place (same size) while it is published",
        "the loopback S3 proxy rewrites the shard when the publish has opened it, while its parts are sent, once its object is stored, or between the hash pass and the re-read of a file larger than the memory budget",
        "SnapshotError naming the file; no index; its multipart upload aborted; every stored object equals its cwtrain-sha256",
    ),
    "truncated-shard": (
        "a shard truncated while it is published",
        "the proxy truncates the shard under a publisher process (upload_snapshot, HotLoader.upload), while its parts are sent, and during the re-read of a file larger than the budget",
        "no SIGBUS: SnapshotError naming the file, exit 1; no index; no unfinished multipart upload",
    ),
    "stored-mismatch": (
        "the store receives or records other bytes than were hashed",
        "the proxy flips a byte of a PutObject body (and, like S3, checks bodies against x-amz-checksum-sha256), or rewrites the cwtrain-sha256 of a multipart upload",
        "the body is refused (BadDigest) or the HEAD after the write disagrees: SnapshotChecksumError naming the object; no index",
    ),
    "local-auth": (
        "unauthenticated callers of the local stack",
        "requests without a token or with a wrong one to the control plane, a gateway and a replica (/admin/hotload, /admin/weights, /v1/completions), some declaring a 1 GiB body they never send",
        "401 in each server's error shape before a byte of the body is read; the replica keeps its identity; /health and /tokenize answer without one, as vLLM's --api-key guards only /v1",
    ),
    "local-bodies": (
        "malformed or oversized request bodies",
        "Content-Length abc, -1, 1e11 and 10^11, two framings, bad chunk sizes, an oversized chunked body, a body cut short, to the control plane, a gateway and a replica",
        "400 or 413 in each server's error shape, at once and without a traceback; the server keeps answering",
    ),
    "local-ids": (
        "resource ids that are not one plain path segment",
        "GET and DELETE of escaped ids holding ?, /, % or control characters, and a create with the id parameters",
        "invalid_argument naming the id; nothing is looked up, deleted or created",
    ),
    "bad-input": (
        "bad input (fuzzed)",
        "hypothesis: request files, index JSON, safetensors headers, identities, variable values, timeouts",
        "a clear error naming the input, exit 1 or 2, nothing written or sent",
    ),
    "wrong-predecessor": (
        "a delta's predecessor the service would refuse after the upload",
        "`hotload publish` of a delta with a mistyped --previous-identity, with `initial`, or on an identity whose "
        "index was deleted from the bucket; `hotload trigger` on an unknown predecessor; a FULL directory of F32 "
        "tensors whose config.json declares bfloat16",
        "exit 1 with one error line naming --previous-identity (and the newest identity that completed); no object "
        "or upload under the new identity, no hot-load; the same identity publishes once the predecessor is right; "
        "the F32 directory gets the in-memory path's DtypeWarning as one warning line; a run's deltas ask the "
        "bucket nothing",
    ),
    "secrets": (
        "secrets in output",
        "CLI and library run with a token, S3 keys and an API key set, DEBUG logs captured",
        "none of the secrets appears in logs, errors or JSON output",
    ),
    "tls": (
        "TLS verification",
        "clients built with defaults, then with the explicit opt-outs",
        "verification on by default for the API and the store; turning it off needs an option and warns",
    ),
    "decode-memory": (
        "deltas that expand past their size, checkpoints larger than the memory budget",
        "snapshot verify of frames declaring 1 TiB or 1 GiB in a few KB; snapshot apply and verify --base with "
        "a 64 MiB budget on a 192 MiB checkpoint; a shard truncated while verify reads it",
        "each decode bounded by the declared size and streamed: peak RSS under the checkpoint size; a clear SnapshotError",
    ),
    "decode-fuzz": (
        "malformed snapshot bytes (fuzzed)",
        "hypothesis, fixed seed and budget: safetensors headers, delta indexes, zstd frames, byte flips in a delta",
        "nothing escapes but a SnapshotError; a frame never decodes past its declared size",
    ),
    "secret-forms": (
        "secrets in other forms",
        "an AWS key and an API header value with a trailing newline, a password in the API URL, a bad token",
        "the error line shows no form of any secret (raw, stripped, repr, bytes, percent-encoded, URL userinfo)",
    ),
    "cli-crash": (
        "inputs that crashed the CLI",
        "a non-ASCII or control-character token, header or origin (fuzzed), an exception no row knows",
        "one error line, exit 1 or 2, no traceback",
    ),
    "out-link": (
        "an output path that is a link",
        "snapshot diff --out a link to an empty directory, to a file, to nothing",
        "the output lands where the link points, or the path is refused before any work",
    ),
    "many-tensors": (
        "a checkpoint of many zero-size tensors",
        "snapshot diff and hotload inspect of 2,000 and 16,000 tensors, zero bytes in all",
        "progress throttled to a few lines; time grows linearly with the tensor count",
    ),
    "id-escape": (
        "resource ids holding URL syntax",
        "get, delete and cancel of ids with ?, #, % and :, and of the id parameters",
        "the id is sent percent-encoded as one path segment: no other resource is addressed",
    ),
    "identity-chars": (
        "identities with control characters or bidi overrides",
        "U+202E, U+200B, NUL, newline and others in identities and predecessors",
        "refused before anything is written or sent",
    ),
    "metadata-clash": (
        "a tensor named like a __metadata__ entry",
        'a tensor `format` beside `"format": "pt"` (or named like another entry) written as a FULL with checksums, '
        "applied, encoded, diffed (`snapshot diff`, `hotload publish --base`)",
        "refused with a SnapshotError; the entry is never overwritten; diff and apply refuse exactly the same "
        "checkpoints, before any output",
    ),
    "verify-nothing": (
        "snapshot verify with nothing it can check",
        "a FULL without checksums, a delta without --base, an empty delta",
        "exit 1 with the reason and result unverified; never ok",
    ),
    "deep-json": (
        "JSON nested far deeper than any real document",
        "request files (deployment/gateway create -f), CWTRAIN_API_HEADERS, an API answer, bodies to the local "
        "control plane, gateway and replica, a Gym rollouts file: 129, 900 and 100,000 levels deep (a completions "
        "answer: malformed-answer; the Gym model_server's body: gym-relay)",
        "a clear error naming the input (exit 1, or 400 in the server's shape), never RecursionError; nothing sent",
    ),
    "undecodable-name": (
        "a checkpoint directory holding a file whose name is not UTF-8",
        "a file named b'\\xff\\xfe-notes.txt' beside the shards: hotload inspect, upload_snapshot, snapshot "
        "apply's side files, the mirror (memory and disk); an index naming a shard through a lone surrogate escape",
        "one error line naming the directory and the name's bytes, exit 1; nothing uploaded or written; never "
        "'internal error'",
    ),
    "malformed-answer": (
        "malformed completions answers",
        "a table (choice index a string, an object, a float, repeated or out of range; token ids out of range; "
        "routes that do not fill their dtype; 100,000-deep JSON) and hypothesis: any value of a valid answer replaced, "
        "read directly and through the sampler",
        "nothing escapes but a RolloutError (retried or reported); what reads is in range and index order",
    ),
    "broken-stream": (
        "an upstream answer that breaks off",
        "a replica's stream cut after two events, cut mid-event, or ended without data: [DONE]; a whole answer cut "
        "mid-body (Content-Length or chunked); a completions answer whose choice has no finish_reason, or abort/error",
        "the gateway ends the stream with vLLM's error event and [DONE] (OpenAI clients raise), a whole answer is an "
        "error status; the sampler retries and never returns a truncated completion as finished",
    ),
    "gym-relay": (
        "the Gym model_server endpoint as an open relay",
        "requests without a token, with Gym's placeholder key or a wrong one (declaring a 1 GiB body), an oversized "
        "or malformed body, a 100,000-deep body; a server advertised on one address reached on another",
        "401 before a byte of the body is read, 413/400 at once, nothing forwarded to the deployment; it listens only "
        "where it is advertised and Gym gets its token",
    ),
    "local-up": (
        "two local stacks on one state file, and local up killed",
        "two 'cwtrain local up' with one state file started at once; SIGKILL of 'local up' with moto's server and a "
        "replica running",
        "the second refuses naming the holder's pid, exit 1, and local down stops the one running; every child is gone "
        "within 10 s of the SIGKILL and the state file is known stale",
    ),
    "local-s3": (
        "the local object store answering otherwise than S3",
        "UploadPart, UploadPartCopy, CompleteMultipartUpload, ListParts and Abort of an aborted or unknown upload; "
        "ListParts while the parts are uploaded; two computations of one part's ETag at once; a wrong secret key, "
        "an unknown access key, no signature (also through a proxy); the stack's keys on odd keys, copies and "
        "presigned URLs",
        "404 NoSuchUpload as S3 answers; every listed part ETag is the MD5 of the part's bytes; 403 "
        "SignatureDoesNotMatch, InvalidAccessKeyId or AccessDenied in S3's XML, not retried, while the stack's "
        "keys sign every request",
    ),
}
