package armsim

import "testing"

func TestFaultKindString(t *testing.T) {
	want := map[FaultKind]string{
		0:                          "FaultKind(0)",
		-1:                         "FaultKind(-1)",
		FaultQuota:                 "Quota",
		FaultAllocation:            "Allocation",
		FaultLROFail:               "LROFail",
		FaultSlowLRO:               "SlowLRO",
		FaultServerError:           "ServerError",
		FaultCommitThenServerError: "CommitThenServerError",
		FaultDeleteFails:           "DeleteFails",
		FaultCommitLate:            "CommitLate",
		FaultDenyAssignment:        "DenyAssignment",
		FaultScopeLocked:           "ScopeLocked",
		FaultForceDeleteRefused:    "ForceDeleteRefused",
		FaultDeletingWithoutIDs:    "DeletingWithoutIDs",
		FaultSlowDelete:            "SlowDelete",
		FaultVanishBeforeDelete:    "VanishBeforeDelete",
		lastFaultKind + 1:          "FaultKind(15)",
	}
	for k, name := range want {
		if got := k.String(); got != name {
			t.Errorf("FaultKind(%d).String() = %q, want %q", int(k), got, name)
		}
	}
}
