package deploy

// WriteIdentity is writeIdentity, for the external tests.
var WriteIdentity = writeIdentity
