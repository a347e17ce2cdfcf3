"""The peers the pipeline talks to, each answering as a hostile or broken one may: the Docker engine, container
registries (through skopeo), package indexes and Debian's security archive. Nothing here knows the stages."""
