#!/usr/bin/env python3
"""scripts/make_kjv_dataset.py writes the default dataset readable as the umask allows (0644
under the usual 022, as a plain open() would), not with the 0600 of its temporary file."""
import os
import stat
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "make_kjv_dataset.py")
OSIS = ('<osis><verse osisID="Gen.1.1" sID="Gen.1.1"/>In the beginning God created the heaven and the '
        'earth.<verse eID="Gen.1.1"/></osis>\n')


class MakeKjvDatasetTest(unittest.TestCase):
    def run_with_umask(self, umask):
        with tempfile.TemporaryDirectory() as d:
            xml, out = os.path.join(d, "kjv.xml"), os.path.join(d, "kjv.jsonl")
            with open(xml, "w", encoding="utf-8") as f:
                f.write(OSIS)
            r = subprocess.run([sys.executable, SCRIPT, xml, out], preexec_fn=lambda: os.umask(umask),
                               capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            with open(out, encoding="utf-8") as f:
                self.assertIn("In the beginning", f.read())
            self.assertEqual([n for n in os.listdir(d) if n.endswith(".tmp")], [])
            return stat.S_IMODE(os.stat(out).st_mode)

    def test_the_dataset_is_readable_by_everyone_under_umask_022(self):
        self.assertEqual(self.run_with_umask(0o022), 0o644)

    def test_a_stricter_umask_is_respected(self):
        self.assertEqual(self.run_with_umask(0o077), 0o600)
        self.assertEqual(self.run_with_umask(0o002), 0o664)


if __name__ == "__main__":
    unittest.main()
