"""The two wizards a user meets before the first chat: hardware validation and model conversion.

`HardwareWizard` (hardware_wizard.py) and `ConvertWizard` (convert_wizard.py) are QWizards the main window opens from
its welcome page and menus. Their engine work runs in `jobs.py` on a QThread, never on the UI thread.
"""
