// Package agent is the preflight agent: it runs GPU, disk and network
// checks on a node and reports the result on the node's own Node object. It
// runs as `vmss-autoscaler preflight [flags]` (see Main).
//
// # Lifecycle
//
// GPU nodes join tainted vmss-autoscaler.io/preflight=pending:NoSchedule and
// labelled vmss-autoscaler.io/preflight=pending. The agent's DaemonSet
// selects nodes by that label value (nodeSelector
// vmss-autoscaler.io/preflight: pending) and tolerates the taint. On its
// node the agent runs the configured checks in order (each with its timeout,
// all within a total deadline, stopping at the first failure) and then:
//
//   - pass: removes the preflight taint (matched by key and effect; no other
//     taint is touched), sets the label to passed, removes the failure
//     annotation, sets vmss-autoscaler.io/preflight-passed-at (RFC 3339), and
//     records a Normal PreflightPassed event on the Node;
//   - fail: sets the label to failed and vmss-autoscaler.io/preflight-failure
//     to "check <name>: <reason>: <output>" (at most outputLimit bytes),
//     keeps the taint, and records a Warning PreflightFailed event. The
//     autoscaler replaces failed nodes; they are not retried (unless
//     --retry-failed).
//
// Then the agent does not exit: a DaemonSet pod that exits is restarted,
// which would loop. It blocks until it is stopped; the label no longer
// matches the DaemonSet's nodeSelector, so the DaemonSet controller deletes
// the pod. Restarting it is safe: a node already passed (label passed, no
// taint) or failed is left alone.
//
// With --periodic (a CronJob, or a long-running pod with --interval) the
// agent checks nodes labelled passed again: a failure sets the label failed
// and the failure annotation but adds no taint (the autoscaler cordons and
// replaces the node); a pass refreshes the passed-at annotation. Nothing is
// ever deleted.
//
// Node updates are Get + Update with the node's resourceVersion, retried on
// conflict (client-go's retry.RetryOnConflict) on a fresh read, so that
// concurrent changes by others (taints, labels) are never lost; the result
// is decided again on that fresh read, so a node whose state changed while
// the checks ran (say, already marked failed) is not overwritten.
//
// # Checks
//
// The checks are read from a YAML file (--checks, mounted from a
// ConfigMap; unknown fields are errors, and every error names the field and
// the value):
//
//	deadline: 10m        # all checks together; default: the sum of every check's
//	                     # timeouts, retries and retry delays
//	outputLimit: 2048    # bytes of a failing check's output kept (1..65536)
//	checks:
//	- name: gpus
//	  command: ["nvidia-smi", "--query-gpu=index,name,pci.bus_id", "--format=csv,noheader"]
//	  timeout: 30s
//	  match: '^\s*\d+, NVIDIA H100 80GB HBM3, '   # RE2, per line of stdout+stderr
//	  minMatches: 8      # default 1 when match is set
//	- name: ecc
//	  command: ["nvidia-smi", "--query-gpu=index,ecc.mode.current,ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits"]
//	  timeout: 30s
//	  match: '^\s*\d+, Enabled, (\S+)\s*$'
//	  minMatches: 8
//	  max: 0             # bound on the captured number, on every matching line
//	- name: xid
//	  command: ["dmesg"]
//	  timeout: 30s
//	  mustNotMatch: 'NVRM: Xid \(PCI:[0-9A-Fa-f:.]+\): (?:48|79|94|95)\b'
//	- name: all-reduce
//	  command: ["all_reduce_perf", "-b", "1G", "-e", "8G", "-f", "2", "-g", "8"]
//	  timeout: 5m
//	  match: '^# Avg bus bandwidth\s*:\s*([0-9.]+)'
//	  min: 300
//	  retries: 1         # run again after a failure (0..10) ...
//	  retryDelay: 10s    # ... this long after it (default 10s)
//
// A check passes when its command exits 0 and its output keeps every rule:
//
//   - match: at least minMatches lines match;
//   - min / max: on every line match matches, the number its group named
//     "value" (else its first group) captures is within [min, max]; a
//     capture that is not a number (nvidia-smi's "[N/A]") fails;
//   - mustNotMatch: no line matches.
//
// The failure says which rule broke and quotes the first offending line
// and value. A failed check runs again up to retries times, retryDelay
// apart, within the deadline (a command that could not start is not
// retried); the last attempt decides. Each command is a real process in
// its own process group: on timeout the group gets SIGTERM and, after a
// grace period, SIGKILL, and whatever the command left running is killed
// when it ends, so no check outlives its run.
//
// The Helm chart ships a library of GPU-node checks built on these rules
// (GPU count and model, ECC, XID, InfiniBand, DCGM diagnostics, NCCL
// all-reduce), tested against fixtures of the tools' output in
// testdata/library (library_test.go).
//
// # RBAC
//
// The agent needs, cluster-wide (RBAC.md has a ClusterRole):
//
//   - nodes: get, update — to read its node and write the taint, label and
//     annotations;
//   - events: create, patch — in the "default" namespace, where events about
//     cluster-scoped objects such as Nodes go.
//
// RBAC cannot restrict a DaemonSet's service account to its own node:
// resourceNames in a Role are fixed, while every pod of the DaemonSet runs
// on a different node, and the NodeRestriction admission plugin applies to
// kubelets' credentials, not to service accounts. The code reads and updates
// only the node named by --node-name ($NODE_NAME from the downward API,
// spec.nodeName) and refuses to start without it. A cluster that wants the
// API server to enforce it can add a ValidatingAdmissionPolicy comparing the
// node's name with the node-name claim of the pod-bound service account
// token (user extra authentication.kubernetes.io/node-name); RBAC.md has an
// example.
package agent
