"""``sparkcep token FILE`` writes the file 0600 and leaves the mode of a directory it did not make."""

import stat

from sparkcep import auth
from sparkcep.cli import main


def test_the_token_file_is_private_and_its_existing_directory_keeps_its_mode(tmp_path):
    """It made the file's directory 0700: ``sparkcep token /tmp/cluster.token`` shut everyone else out of /tmp."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    assert main(["token", str(shared / "cluster.token")]) == 0
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert stat.S_IMODE((shared / "cluster.token").stat().st_mode) == 0o600
    assert len(auth.read(shared / "cluster.token")) == 2 * auth.TOKEN_BYTES
    assert main(["token", str(tmp_path / "new" / "dir" / "cluster.token")]) == 0
    assert stat.S_IMODE((tmp_path / "new" / "dir").stat().st_mode) == 0o700


def test_a_token_is_written_to_a_path_given_as_a_string(tmp_path):
    """As it is read from one: ``auth.write("cluster.token", ...)`` raised AttributeError ('str' has no parent)."""
    token = auth.generate()
    assert auth.write(str(tmp_path / "cluster.token"), token) == tmp_path / "cluster.token"
    assert auth.read(str(tmp_path / "cluster.token")) == token
    assert stat.S_IMODE((tmp_path / "cluster.token").stat().st_mode) == 0o600
