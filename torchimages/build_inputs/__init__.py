"""What a build fetches from the server the builder runs beside it: the row's wheels, pip's settings and the script
that installs one venv layer (torchimages.build_inputs.install_layer). Nothing of it enters the build context."""
