; Inno Setup 6 script for RAM Desktop on Windows x64.
; STATUS: NOT BUILT OR TESTED. Written on Linux without a Windows machine; expect to fix details on
; the first real build. See packaging/windows/README.md for the steps.
;
; Input: the one-folder PyInstaller bundle dist\ram-desktop\ built on Windows from
; packaging\ram-desktop.spec (there it contains the windowed ram-desktop.exe and the console
; ram-merge.exe sharing _internal\). Build:
;   iscc /DAppVersion=0.1.0 packaging\windows\ram-desktop.iss
; Output: dist\ram-desktop-<version>-windows-x86_64-setup.exe

#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif
#define AppName "RAM Desktop"
#define Root "..\.."

[Setup]
AppId={{A42B7CF8-99BA-4848-B45F-1DC0FEFF1508}
AppName={#AppName}
AppVersion={#AppVersion}
AppPublisher=RAM Desktop developers
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
DisableProgramGroupPage=yes
; per-user install by default (no admin prompt); the user can choose all users
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir={#Root}\dist
OutputBaseFilename=ram-desktop-{#AppVersion}-windows-x86_64-setup
; PyInstaller can make the .ico from resources\ram-desktop.png when Pillow is installed; Inno Setup
; needs a real .ico: packaging\windows\make-ico.py writes build\ram-desktop.ico
SetupIconFile={#Root}\build\ram-desktop.ico
UninstallDisplayIcon={app}\ram-desktop.exe
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
ChangesEnvironment=yes

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked
Name: "addtopath"; Description: "Add ram-merge to PATH (command line)"; GroupDescription: "Command line:"

[Files]
Source: "{#Root}\dist\ram-desktop\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\{#AppName}"; Filename: "{app}\ram-desktop.exe"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\ram-desktop.exe"; Tasks: desktopicon

[Registry]
; user PATH gets the install folder so that `ram-merge` (console exe) works in a new terminal
Root: HKCU; Subkey: "Environment"; ValueType: expandsz; ValueName: "Path"; ValueData: "{olddata};{app}"; \
  Tasks: addtopath; Check: NeedsAddPath(ExpandConstant('{app}'))

[Run]
Filename: "{app}\ram-desktop.exe"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[Code]
function NeedsAddPath(Dir: string): Boolean;
var
  Path: string;
begin
  if not RegQueryStringValue(HKEY_CURRENT_USER, 'Environment', 'Path', Path) then
  begin
    Result := True;
    exit;
  end;
  Result := Pos(';' + Uppercase(Dir) + ';', ';' + Uppercase(Path) + ';') = 0;
end;
