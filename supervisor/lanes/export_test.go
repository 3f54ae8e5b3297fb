package lanes

// GroupAlive is groupAlive for the tests.
var GroupAlive = groupAlive
