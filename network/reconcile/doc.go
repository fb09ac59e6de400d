// Package reconcile runs the background loop that finishes what reclaim
// deferred and what the pool could not remove: each pass scans the host,
// tears down the slots of quarantined indices and any stray resources of
// free indices (a host link whose namespace is gone, a set element without
// a slot, a netns file nobody owns), and frees in the allocator every
// quarantined index whose slot is now completely gone. Indices that are
// acquired (warm in the pool or in use) are never touched.
package reconcile
