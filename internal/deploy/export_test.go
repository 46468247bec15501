package deploy

import "time"

// WriteIdentity is writeIdentity, for the external tests.
var WriteIdentity = writeIdentity

// DirectDial is directDial.
var DirectDial = directDial

// PauseAhead holds every StartAhead of d for p before its restore, so that
// a test's deploy arrives while the slot is being restored ahead.
func PauseAhead(d *Deployer, p time.Duration) { d.aheadPause = p }
