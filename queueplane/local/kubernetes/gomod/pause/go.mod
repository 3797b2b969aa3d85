// The pod sandbox process, built here because no registry serves a pause image to this cluster.
module queueplane.local/pause

go 1.25.0
