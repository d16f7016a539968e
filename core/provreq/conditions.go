package provreq

import (
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Condition reasons: cluster-autoscaler's where the meaning is the same
// (Kueue shows the messages to users).
const (
	ReasonAccepted               = "Accepted"
	ReasonCapacityIsFound        = "CapacityIsFound"
	ReasonCapacityIsProvisioned  = "CapacityIsProvisioned"
	ReasonCapacityIsNotFound     = "CapacityIsNotFound"
	ReasonCapacityIsQueued       = "CapacityIsQueued"
	ReasonFailedToCreatePods     = "FailedToCreatePods"
	ReasonExpired                = "Expired"
	ReasonReservationTimeExpired = "CapacityReservationTimeExpired"
	ReasonBookingConsumed        = "CapacityBookingConsumed"
	ReasonCapacityIsRevoked      = "CapacityIsRevoked"
	// ReasonBookingLost: a booking's pods fit nowhere it may hold room
	// (BookingExpired=True; Tracker.Lost).
	ReasonBookingLost = "CapacityBookingLost"
	// ReasonExceedsQuota: its pods would take more than its namespace's
	// ResourceQuotas leave (Provisioned=False, tried again with the
	// backoff: a quota may be raised).
	ReasonExceedsQuota = "ExceedsResourceQuota"
	// ReasonLimitReached: left out by the bounds on requests a loop
	// plans (Provisioned=False; planned when older ones finish).
	ReasonLimitReached            = "RequestLimitReached"
	acceptedMessage               = "ProvisioningRequest is accepted by vmss-autoscaler"
	expiredMessage                = "ProvisioningRequest is expired: not provisioned within 7 days of its creation"
	reservationTimeExpiredMessage = "Capacity reservation time is expired: the capacity was booked for 10 minutes"
)

// Find returns the condition of type t, or nil.
func Find(r *ProvisioningRequest, t string) *metav1.Condition {
	return apimeta.FindStatusCondition(r.Status.Conditions, t)
}

// IsTrue says the condition of type t is True.
func IsTrue(r *ProvisioningRequest, t string) bool {
	return apimeta.IsStatusConditionTrue(r.Status.Conditions, t)
}

// Finished says nothing more is done for the request: it failed, its
// booking ended or its capacity was revoked.
func Finished(r *ProvisioningRequest) bool {
	return IsTrue(r, Failed) || IsTrue(r, BookingExpired) || IsTrue(r, CapacityRevoked)
}

// SetCondition sets a condition of r (a copy the caller owns) with r's
// generation as its observedGeneration. As for any Kubernetes condition,
// its lastTransitionTime moves only when its status changes. It reports
// whether anything changed.
func SetCondition(r *ProvisioningRequest, t string, status metav1.ConditionStatus, reason, message string, now time.Time) bool {
	return apimeta.SetStatusCondition(&r.Status.Conditions, metav1.Condition{
		Type: t, Status: status, Reason: reason, Message: message,
		ObservedGeneration: r.Generation, LastTransitionTime: metav1.NewTime(now),
	})
}
