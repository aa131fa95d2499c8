//! sandcell-local: sandboxes as directories and process groups on this host.

mod contained;
