package audit

// SealLockKey is the first key of the sequencers' advisory lock, for a test that finds the sequencer's backend.
const SealLockKey = sealLock
