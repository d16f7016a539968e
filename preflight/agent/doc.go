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
// ConfigMap):
//
//	deadline: 10m        # all checks together; default: the sum of the timeouts
//	outputLimit: 2048    # bytes of a failing check's output kept (1..65536)
//	checks:
//	- name: gpus
//	  command: ["nvidia-smi", "-L"]
//	  timeout: 30s
//	  match: '^GPU \d+:' # RE2; counted per line of stdout+stderr
//	  minMatches: 8      # default 1 when match is set
//	- name: dcgm
//	  command: ["dcgmi", "diag", "-r", "1"]
//	  timeout: 5m
//
// A check passes when its command exits 0 and, if it has a match, at least
// minMatches lines of its combined output match. Each command is a real
// process in its own process group: on timeout the group gets SIGTERM and,
// after a grace period, SIGKILL, and whatever the command left running is
// killed when it ends, so no check outlives its run.
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
