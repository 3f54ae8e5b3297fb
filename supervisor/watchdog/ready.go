package watchdog

// Ready says whether the lane takes work now and, when not, why (the job queue's view of the
// lane: jobs.LaneHealth). A held or degraded lane is not ready.
func (h *Health) Ready() (ok bool, reason string) {
	st := h.Status()
	if st.State == LaneHealthy {
		return true, ""
	}
	return false, st.State.String() + ": " + st.Reason
}
